"""How ONNX Runtime's n-bit operators store a weight, and the weight read back: codes narrower than a byte
packed `8 // bits` to a byte, low bits first (MatMulNBits' layout: `pack`, `unpack`); a MatMulNBits node's
codes with their scales and zero points (`nbits_grid`) and the weight they make (`dequantize_nbits`); block
scales in either precision (`scale_values`: fp32, or fp16 behind a Cast, quantization.storage.half_scales' form);
the first opset with 4-bit tensors (`TABLE_OPSET`). The quantization writes these graphs; the kinds and the
quantization's corrections read them back."""

from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = [
    "TABLE_OPSET",
    "pack",
    "unpack",
    "NBitsGrid",
    "nbits_grid",
    "dequantize_nbits",
    "dequantize_grid",
    "constant_of",
    "scale_values",
]

TABLE_OPSET = 21  # the first opset with 4-bit tensors, which GatherBlockQuantized's codes are


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """(rows, n) codes in [0, 2^bits), n a multiple of 8 // bits, as (rows, n · bits / 8) uint8: code j in
    byte j // (8 // bits), at bit (j mod (8 // bits)) · bits."""
    per = 8 // bits
    rows, n = codes.shape
    groups = codes.astype(np.uint8).reshape(rows, n // per, per)
    shifts = (np.arange(per) * bits).astype(np.uint8)
    return np.bitwise_or.reduce(groups << shifts, axis=-1).astype(np.uint8)


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """Codes packed as `pack` packs them, `8 // bits` to a byte, unpacked along the last axis (numpy uint8)."""
    per = 8 // bits
    packed = np.asarray(packed, dtype=np.uint8)
    codes = np.stack([(packed >> np.uint8(bits * j)) & np.uint8((1 << bits) - 1) for j in range(per)], axis=-1)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * per)


class NBitsGrid(NamedTuple):
    """A MatMulNBits weight (K × N) as stored: `codes` (N × blocks · block), one scale and zero point a block
    (`scales` float64, `zero` integers, N × blocks), `bits` wide in blocks of `block` along K."""

    codes: np.ndarray
    scales: np.ndarray
    zero: np.ndarray
    k: int
    bits: int
    block: int


def nbits_grid(graph: onnx.GraphProto, node: onnx.NodeProto) -> NBitsGrid:
    """The codes, scales (either precision, half_scales) and zero points (2^(bits−1) when absent) of the
    MatMulNBits `node`: codes B (N, blocks, block·bits/8), zero points packed like the codes."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    k, n, bits, block = attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]
    inits = {i.name: i for i in graph.initializer if i.name in node.input}
    blocks = -(-k // block)
    codes = unpack(numpy_helper.to_array(inits[node.input[1]]), bits).reshape(n, blocks * block)
    scales = scale_values(graph, node.input[2]).astype(np.float64).reshape(n, blocks)
    if len(node.input) > 3 and node.input[3]:
        zero = unpack(numpy_helper.to_array(inits[node.input[3]]).reshape(n, -1), bits)[:, :blocks]
    else:
        zero = np.full((n, blocks), 1 << (bits - 1))
    return NBitsGrid(codes, scales, zero, k, bits, block)


def dequantize_nbits(graph: onnx.GraphProto, node: onnx.NodeProto) -> np.ndarray:
    """The weight Q (K × N, float64) a MatMulNBits node multiplies by: scale · (q − z) a block (nbits_grid)."""
    return dequantize_grid(nbits_grid(graph, node))


def dequantize_grid(grid: NBitsGrid, columns: slice = slice(None)) -> np.ndarray:
    """The weight Q (K × N, float64) of `grid`, or the `columns` of it (a slice of N)."""
    codes, zero, scales = grid.codes[columns], grid.zero[columns], grid.scales[columns]
    n, blocks = scales.shape
    weight = (codes.reshape(n, blocks, grid.block).astype(np.float64) - zero[..., None]) * scales[..., None]
    return weight.reshape(n, blocks * grid.block)[:, : grid.k].T


def constant_of(graph: onnx.GraphProto, name: str) -> onnx.TensorProto | None:
    """The initializer `name` is, or that a Cast of an initializer to float32 reads (half_scales' form)."""
    inits = {i.name: i for i in graph.initializer}
    if name in inits:
        return inits[name]
    cast = next((n for n in graph.node if n.op_type == "Cast" and n.output[0] == name), None)
    return None if cast is None else inits.get(cast.input[0])


def scale_values(graph: onnx.GraphProto, name: str) -> np.ndarray:
    """The float32 values of the scales input `name`, stored in either precision."""
    init = constant_of(graph, name)
    if init is None:
        raise KeyError(f"{name!r} is no constant of the graph")
    return numpy_helper.to_array(init).astype(np.float32)
