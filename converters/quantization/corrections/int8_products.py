"""4-bit codes, int8 products: a corrected graph's layers multiplied by ONNX Runtime's dynamic int8 kernel.

ONNX Runtime's MatMulNBits multiplies 4-bit weights no faster than its fp32 MatMul on a batch of a thousand
tokens here, and each low-rank correction adds two more products; its dynamic int8 MatMul
(`DynamicQuantizeMatMul`: x rounded to 8 bits, one scale a call, then VNNI integer products) runs 3 to 4 ×
faster than either (BENCHMARKS.md, "4-bit codes, int8 products"). So each MatMulNBits layer y = Q x (+ its
correction (x L) R) is rewritten as a constant subgraph over the codes the file already holds,

    W = Q + L R,   s_n = max_k |W_kn| / 127,   W8 = round(W / s)   (int8, one scale a column),

and `DynamicQuantizeMatMul(x, W8, s)`. Every input of that subgraph is an initializer: ONNX Runtime folds it
into W8 and s when the session starts (its constant folding, the one that reads half_scales' Casts), so the
file keeps the 4-bit codes and the int8 factors, and each such layer runs as one int8 product, its correction
free. Its input is then rounded to 8 bits with one scale a tensor: a layer whose input that scale does not hold
(its output moved by more than INT8_INPUT_TOL, measured on calibration batches: `int8_layers`) keeps its
MatMulNBits and its correction. The price is memory: ONNX Runtime keeps each folded intermediate (the codes
unpacked, in float, scaled, corrected; QuantizeLinear then rounds to int8 in one step) until the graph is
resolved, and the process keeps that memory (BENCHMARKS.md: on MiniLM some 30 bytes a folded weight).
GatherBlockQuantized, which would unpack the codes in one step, is not folded, nor is DequantizeLinear unless the
session disables its QDQ fusions, nor an fp16 product (no CPU kernel)."""

import numpy as np
import onnx
from onnx import helper, numpy_helper

from compressor.errors import CompressorError
from converters.quantization.corrections.correction import corrected_layers
from converters.quantization.rounding.int4 import weight_names
from converters.quantization.rounding.smoothing import probe_activations
from converters.quantization.rounding.three_bit_linear import CODES_SUFFIX
from converters.quantization.storage.packed_codes import Builder, default_opset, unpacked

__all__ = ["INT8_LEVEL", "INT8_INPUT_TOL", "INPUT_BATCHES", "int8_rounding_errors", "int8_layers", "int8_products"]

INT8_LEVEL = 127  # |codes| of the int8 weights, symmetric
_TINY = 1e-30  # a column of zeros keeps a scale
# A layer multiplies in int8 when rounding its input to 8 bits (one scale a tensor) moves its output by at most
# this much, relative: on MiniLM smoothed at int4's α 0.5 the query, key and value projections are at 0.011–0.019,
# the FFN down-projections at 0.08–0.12 (their input the GELU's) but the last layer's; 0.02 multiplies 26 of the 36
# layers in int8 and keeps int4-trained's recall@10 (BENCHMARKS.md, "4-bit codes, int8 products").
INT8_INPUT_TOL = 0.02
INPUT_BATCHES = 4  # calibration batches the errors are measured on


def int8_rounding_errors(model: onnx.ModelProto, feeds: list[dict]) -> dict[str, float]:
    """Output name → ‖(x̃ − x) W‖ / ‖x W‖ of each MatMul with a constant weight W of `model` (smoothed, fp32),
    x̃ its input x rounded as DynamicQuantizeLinear rounds it (uint8, one scale a tensor, zero exact), over the
    first INPUT_BATCHES of `feeds` (padding included: ONNX Runtime rounds the whole tensor)."""
    names = weight_names(model.graph)
    inputs = {n.output[0]: n.input[0] for n in model.graph.node if n.output[0] in names}
    wanted = set(names.values())
    weights = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer if i.name in wanted}
    moved, kept = dict.fromkeys(inputs, 0.0), dict.fromkeys(inputs, 0.0)
    for _, values in probe_activations(model, sorted(set(inputs.values())), feeds[:INPUT_BATCHES]):
        rounded = {}
        for name, value in values.items():
            x = value.reshape(-1, value.shape[-1]).astype(np.float64)
            low, high = min(x.min(), 0.0), max(x.max(), 0.0)
            scale = max((high - low) / 255, _TINY)
            zero = np.round(-low / scale)
            rounded[name] = (x, (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale)
        for out, name in inputs.items():
            x, x8 = rounded[name]
            weight = weights[names[out]]
            moved[out] += float((((x8 - x) @ weight) ** 2).sum())
            kept[out] += float(((x @ weight) ** 2).sum())
    return {out: (moved[out] / max(kept[out], _TINY)) ** 0.5 for out in inputs}


def int8_layers(model: onnx.ModelProto, feeds: list[dict]) -> frozenset[str]:
    """The output names of the MatMuls of `model` whose int8 rounding error is at most INT8_INPUT_TOL."""
    return frozenset(out for out, error in int8_rounding_errors(model, feeds).items() if error <= INT8_INPUT_TOL)


def _blocked_weight(b: Builder, graph: onnx.GraphProto, node: onnx.NodeProto) -> str:
    """Qᵀ of a MatMulNBits node as (N, blocks, block) floats, from its codes (a 3-bit layer's as its planes give
    them), block scales and zero points (2^(bits−1) when absent): (q − z) s per block."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    n, bits, block = attrs["N"], attrs["bits"], attrs["block_size"]
    blocks = -(-attrs["K"] // block)
    computed = node.input[1] + CODES_SUFFIX  # a 3-bit layer's codes, one a byte (three_bit_linear)
    if any(computed in other.output for other in graph.node):
        codes = computed
    else:
        codes = unpacked(b, node.input[1], n, blocks * block * bits // 8, bits)
    codes = b.op("Cast", [b.op("Reshape", [codes, b.const([n, blocks, block], np.int64)])], to=onnx.TensorProto.FLOAT)
    scales = b.op("Reshape", [node.input[2], b.const([n, blocks, 1], np.int64)])
    if len(node.input) > 3 and node.input[3]:
        zero = unpacked(b, node.input[3], n, -(-blocks * bits // 8), bits)
        zero = b.op("Slice", [zero, b.const([0], np.int64), b.const([blocks], np.int64), b.const([1], np.int64)])
        zero = b.op("Cast", [b.op("Unsqueeze", [zero, b.const([-1], np.int64)])], to=onnx.TensorProto.FLOAT)
    else:
        zero = b.const(1 << (bits - 1), np.float32)
    return b.op("Mul", [b.op("Sub", [codes, zero]), scales])


def _factor(b: Builder, weight: str) -> str:
    """A correction factor as quantize_dynamic stores it (WEIGHT_quantized, _scale, _zero_point), in float,
    transposed."""
    codes, zero = (
        b.op("Cast", [f"{weight}_{part}"], to=onnx.TensorProto.FLOAT) for part in ("quantized", "zero_point")
    )
    return b.op("Transpose", [b.op("Mul", [b.op("Sub", [codes, zero]), f"{weight}_scale"])], perm=[1, 0])


def _prune(graph: onnx.GraphProto) -> None:
    """Remove the nodes no output needs, then the initializers no node reads (in place)."""
    nodes, outputs = list(graph.node), {o.name for o in graph.output}
    while True:
        used = {name for node in nodes for name in node.input} | outputs
        kept = [node for node in nodes if any(out in used for out in node.output)]
        if len(kept) == len(nodes):
            break
        nodes = kept
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in nodes for name in node.input}
    inits = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(inits)


def int8_products(
    model: onnx.ModelProto, layers: frozenset[str] | None = None, level: int = INT8_LEVEL
) -> onnx.ModelProto:
    """`model` (a corrected graph whose factors are stored as dynamic int8, changed in place) with each
    MatMulNBits layer of `layers` (output names as the fp32 graph has them; None: all) and its correction one
    DynamicQuantizeMatMul on W8 = round((Q + L R) / s), s = max|W| / `level` (127; 64 for a CPU that sums pairs
    of products in int16: target_cpu), W8 and s computed from the stored
    codes by nodes ONNX Runtime folds at session start; the other layers stay as they are."""
    graph = model.graph
    opset = default_opset(model)
    corrected = set(corrected_layers(model))
    built, replaced, folded = [], {}, set()
    chosen = [
        node
        for node in graph.node
        if node.op_type == "MatMulNBits" and (layers is None or node.output[0].removesuffix("_rounded") in layers)
    ]
    for index, node in enumerate(chosen):
        if len(node.input) > 4 and node.input[4]:  # g_idx: an act-order permutation, which no scheme here writes
            raise CompressorError(f"{node.name!r} holds a g_idx; int8 products take MatMulNBits in plain block order")
        out = node.output[0].removesuffix("_rounded")
        b = Builder(f"int8w{index}", opset)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        k, n, block = attrs["K"], attrs["N"], attrs["block_size"]
        blocks = -(-k // block)
        weight = _blocked_weight(b, graph, node)  # Qᵀ as (N, blocks, block): each float step is a copy held at start
        if out in corrected:  # (L R)ᵀ = Rᵀ Lᵀ (N × K), padded to whole blocks
            product = b.op("MatMul", [_factor(b, f"{out}_R"), _factor(b, f"{out}_L")])
            if blocks * block != k:
                product = b.op("Pad", [product, b.const([0, 0, 0, blocks * block - k], np.int64)])
            weight = b.op("Add", [weight, b.op("Reshape", [product, b.const([n, blocks, block], np.int64)])])
        largest = b.op("Max", [b.reduce("ReduceMax", weight), b.op("Neg", [b.reduce("ReduceMin", weight)])])
        scale = b.op("Div", [b.op("Max", [largest, b.const(_TINY, np.float32)]), b.const(level, np.float32)])
        zero = b.op("ConstantOfShape", [b.const([n], np.int64)], value=numpy_helper.from_array(np.zeros(1, np.int8)))
        codes = b.op("QuantizeLinear", [weight, scale, zero], axis=0)  # round(W / s) to int8, one step
        codes = b.op("Reshape", [codes, b.const([n, blocks * block], np.int64)])
        if blocks * block != k:
            codes = b.op("Slice", [codes, b.const([0], np.int64), b.const([k], np.int64), b.const([1], np.int64)])
        weight = b.op("Transpose", [codes], perm=[1, 0])
        bias = node.input[5] if len(node.input) > 5 else ""
        replaced[node.name] = [  # the subgraph just before its product: the graph stays in topological order
            *b.nodes,
            helper.make_node(
                "DynamicQuantizeMatMul",
                [node.input[0], weight, scale, "", bias] if bias else [node.input[0], weight, scale],
                [node.output[0]],
                name=f"{out}_int8",
                domain="com.microsoft",
            ),
        ]
        built.append(b)
        folded.add(out)
    nodes = []
    for node in graph.node:
        if node.name.endswith("_corrected") and node.name.removesuffix("_corrected") in folded:
            kept = next(name for name in node.input if not name.endswith("_xLR"))
            node = helper.make_node("Identity", [kept], [node.output[0]], name=node.name)
        nodes.extend(replaced.get(node.name, [node]))
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(init for b in built for init in b.inits)
    _prune(graph)
    return model
