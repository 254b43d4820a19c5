"""Linear layers in 3 bits: each block of `block` weights along K of a column, w ≈ s · (q − z) with q, z in [0, 8),
a low-rank correction taking back what the coarser rounding loses (the corrected schemes). ONNX Runtime's
MatMulNBits runs 2, 4 and 8 bits, its quantizer writes no 3; so the codes are rounded here into MatMulNBits'
4-bit layout (`three_bit_matmuls`, the scale of each block chosen among shrunk ranges for the least squared
error), and the file stores any 4-bit layer whose codes and zero points all fit in 3 bits as two bit planes,
q = lo + 4 · hi (lo 2 bits, four to a byte; hi 1 bit, eight; nbits_storage's layout), with a subgraph of byte
operators that rebuilds the 4-bit codes: ONNX Runtime folds it into the constant MatMulNBits reads when the
session starts (the same speed, measured; int8_products folds on from there), so the codes take 3 bits a weight
where 4-bit codes take 4 (each block's scale and zero point as before). The price is memory at session start:
ONNX Runtime holds the folding's byte tensors until the session is built (BENCHMARKS.md, "Linear layers in 3
bits")."""

import numpy as np
import onnx
from onnx import helper, numpy_helper

from compressor.errors import CompressorError
from converters.nbits_storage import pack, unpack
from converters.quantization.storage.packed_codes import Builder, default_opset, unpacked

__all__ = ["LINEAR_BITS", "SHRINKS", "CODES_SUFFIX", "three_bit_matmuls", "three_bit_storage", "three_bit_layers"]

LINEAR_BITS = (4, 3)  # --linear-bits: ONNX Runtime's 4, or 3 stored as planes (the corrected schemes')
# The ranges tried for each block's scale, shrunk from [min(w, 0), max(w, 0)]: at 8 levels clipping the extremes
# pays (on MiniLM's smoothed layers the best shrink is below 1 for most blocks).
SHRINKS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7)
_LEVELS = 7
_PLANES = ("lo", "hi")  # initializers B_part of a layer stored in 3 bits (B: its MatMulNBits codes' name)
CODES_SUFFIX = "_codes"  # B_codes: the codes one a byte, as the subgraph computes them
BITWISE_OPSET = 18


def _rounded(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes (N, blocks, block) uint8 in [0, 8), scales (N, blocks) float32 on fp16 values, zero points (N,
    blocks) uint8) of blocks `weight` (N, blocks, block): asymmetric, each block's range shrunk by the SHRINKS
    factor of least squared error."""
    low, high = np.minimum(weight.min(-1, keepdims=True), 0), np.maximum(weight.max(-1, keepdims=True), 0)
    best = None
    for shrink in SHRINKS:
        scale = ((high - low) * shrink / _LEVELS).astype(np.float16).astype(np.float32)
        safe = np.where(scale > 0, scale, 1)
        zero = np.clip(np.round(-low * shrink / safe), 0, _LEVELS)
        codes = np.clip(np.round(weight / safe) + zero, 0, _LEVELS)
        error = (((codes - zero) * scale - weight) ** 2).sum(-1, keepdims=True)
        if best is None:
            best = [codes, scale, zero, error]
            continue
        better = error < best[3]
        best = [np.where(better, new, old) for new, old in zip((codes, scale, zero, error), best)]
    codes, scale, zero, _ = best
    return codes.astype(np.uint8), scale[..., 0], zero[..., 0].astype(np.uint8)


def three_bit_matmuls(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """`model` (changed in place) with each 4-bit MatMulNBits whose output names a weight of `weights` (output →
    K × N fp32, the weight before rounding) rounded again in 3 bits (`_rounded`), in 4-bit layout."""
    inits = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "MatMulNBits" or attrs["bits"] != 4 or node.output[0] not in weights:
            continue
        k, n, block = attrs["K"], attrs["N"], attrs["block_size"]
        if k % block or len(node.input) < 4 or not node.input[3]:
            raise CompressorError(f"{node.name!r}: 3-bit layers take whole blocks along K and zero points")
        codes, scale, zero = _rounded(weights[node.output[0]].astype(np.float32).T.reshape(n, k // block, block))
        stored = {
            node.input[1]: pack(codes.reshape(n, k), 4).reshape(n, k // block, block // 2),
            node.input[2]: scale,
            node.input[3]: pack(np.pad(zero, ((0, 0), (0, (k // block) % 2))), 4),
        }
        for name, value in stored.items():
            old = numpy_helper.to_array(inits[name])
            inits[name].CopyFrom(numpy_helper.from_array(value.reshape(old.shape).astype(old.dtype), name))
    return model


def three_bit_layers(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The 4-bit MatMulNBits nodes of `model` whose codes and zero points all lie in [0, 8), codes in whole bytes."""
    inits = {i.name: i for i in model.graph.initializer}
    found = []
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "MatMulNBits" or attrs["bits"] != 4 or node.input[1] not in inits:
            continue
        if attrs["K"] % 8 or len(node.input) < 4 or node.input[3] not in inits:
            continue
        parts = (numpy_helper.to_array(inits[name]) for name in node.input[1:4:2])
        if all(unpack(part.reshape(-1, part.shape[-1]), 4).max() < 8 for part in parts):
            found.append(node)
    return found


def _codes(b: Builder, planes: dict[str, str], n: int, k: int, out: str) -> str:
    """(n, k) uint8 codes q = lo + 4 · hi of the two planes, under the name `out`."""
    high = b.op("BitShift", [unpacked(b, planes["hi"], n, k // 8, 1), b.const(2, np.uint8)], direction="LEFT")
    return b.op("BitwiseOr", [unpacked(b, planes["lo"], n, k // 4, 2), high], out=out)


def three_bit_storage(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (changed in place) with the codes of each of its `three_bit_layers` stored as two bit planes: a
    subgraph computes the codes (n, K) under the name B + CODES_SUFFIX (int8_products reads them there)
    and from them the 4-bit codes under their own name B (module docstring): the graph computes what it did."""
    graph = model.graph
    opset = default_opset(model)
    if opset < BITWISE_OPSET:
        raise CompressorError(
            f"3-bit layers are rebuilt by BitwiseAnd and BitwiseOr (opset {BITWISE_OPSET}); the graph is at {opset}"
        )
    inits = {i.name: i for i in graph.initializer}
    for index, node in enumerate(three_bit_layers(model)):
        name = node.input[1]
        packed = numpy_helper.to_array(inits[name])
        n, k = packed.shape[0], packed[0].size * 2
        codes = unpack(packed.reshape(n, -1), 4)
        b = Builder(f"w3b{index}", opset)
        planes = {part: f"{name}_{part}" for part in _PLANES}
        pairs = b.op("Reshape", [_codes(b, planes, n, k, name + CODES_SUFFIX), b.const([n, k // 2, 2], np.int64)])
        first, second = (
            b.op("Slice", [pairs, b.const([j], np.int64), b.const([j + 1], np.int64), b.const([2], np.int64)])
            for j in (0, 1)
        )
        byte = b.op("BitwiseOr", [first, b.op("BitShift", [second, b.const(4, np.uint8)], direction="LEFT")])
        b.op("Reshape", [byte, b.const(list(packed.shape), np.int64)], out=name)
        at = list(graph.node).index(node)
        for offset, new in enumerate(b.nodes):
            graph.node.insert(at + offset, new)
        graph.initializer.remove(inits[name])
        graph.initializer.extend(
            [
                *b.inits,
                numpy_helper.from_array(pack(codes & 3, 2), planes["lo"]),
                numpy_helper.from_array(pack(codes >> 2, 1), planes["hi"]),
            ]
        )
    return model
