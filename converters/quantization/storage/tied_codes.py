"""A tied table's codes stored once. A tied LM reads its table E (V × D) twice: a Gather of the token
rows, and the head's logits x Eᵀ, which the quantizers take as a MatMul on a transposed copy
(products.products_as_matmul). MatMulNBits holds that copy's codes as (V, D / block, block · bits
/ 8) bytes, each of the V rows cut into blocks along D: the table's rows, blocked as
GatherBlockQuantized blocks them. So the Gather reads the head's codes, scales and zero points
(GatherBlockQuantized along the last axis of that 3-D tensor, then a Reshape back to D; its zero points
unpacked from the head's by a few byte operators ONNX Runtime folds at session start), and the
table's own 4-bit copy (a sixth of SmolLM2's 4-bit file) is not written. Where SmoothQuant scaled the
head's weight rows (W_s = diag(s) Eᵀ), the gathered row is s ⊙ e and is divided by s."""

import numpy as np
import onnx
from onnx import helper, numpy_helper

from converters.quantization.storage.packed_codes import Builder, default_opset, unpacked
from files.onnx_files import weight_array

__all__ = ["tied_pairs", "smoothing_of", "tied_smoothing", "share_tied_codes", "plain_blocks", "nbits_rows"]

TRANSPOSED = "_transposed"  # products.products_as_matmul's name of a table's transposed copy
SMOOTHING_ROWS = 64  # rows of a tied head whose smoothing is read at a time


def tied_pairs(graph: onnx.GraphProto) -> list[str]:
    """The tables E whose transposed copy E_transposed is a MatMul weight of `graph` and that a Gather
    still reads (the graph before quantization)."""
    inits = {i.name for i in graph.initializer}
    gathered = {n.input[0] for n in graph.node if n.op_type == "Gather"}
    return sorted(name for name in inits if name + TRANSPOSED in inits and name in gathered)


def smoothing_of(graph: onnx.GraphProto, table: str) -> np.ndarray | None:
    """s (D,) with E_transposed = diag(s) Eᵀ (SmoothQuant's scaling of the head's input), None when s = 1."""
    inits = {i.name: i for i in graph.initializer}
    table_, head = weight_array(inits[table]), weight_array(inits[table + TRANSPOSED])
    s = np.ones(head.shape[0])
    for at in range(0, len(s), SMOOTHING_ROWS):  # in fp64 a few rows at a time: whole, 4 tables' bytes (0.5B: 4.4 GB)
        w = table_[:, at : at + SMOOTHING_ROWS].T.astype(np.float64)
        w_s = head[at : at + SMOOTHING_ROWS].astype(np.float64)
        norms = (w * w).sum(1)
        s[at : at + SMOOTHING_ROWS] = np.where(norms > 0, (w_s * w).sum(1) / np.maximum(norms, 1e-30), 1.0)
    return None if np.allclose(s, 1.0, rtol=1e-6, atol=0) else s


def tied_smoothing(graph: onnx.GraphProto) -> dict[str, np.ndarray | None]:
    """Each tied table of `graph` (tied_pairs) → its head's smoothing (smoothing_of): share_tied_codes' argument."""
    return {table: smoothing_of(graph, table) for table in tied_pairs(graph)}


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def share_tied_codes(model: onnx.ModelProto, smoothing: dict[str, np.ndarray | None]) -> onnx.ModelProto:
    """`model` (a quantized graph, changed in place) with each table of `smoothing` (table → s or None,
    from the graph before quantization) read from its head's MatMulNBits codes when the head has them
    and the table's Gather is one GatherBlockQuantized (not split by frequency) or one fp32 Gather; its own codes
    (or weights) dropped."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    for table, s in smoothing.items():
        head = next(
            (n for n in graph.node if n.op_type == "MatMulNBits" and n.input[1].startswith(table + TRANSPOSED)), None
        )
        gathers = [
            n
            for n in graph.node
            if n.op_type == "GatherBlockQuantized"
            and n.input[0].startswith(table + "_Q")
            or n.op_type == "Gather"
            and n.input[0] == table  # left in fp32 (a tied head's 8-bit half: tied_head)
        ]
        if head is None or len(gathers) != 1 or not plain_blocks(head):
            continue
        (gather,) = gathers
        prefix = f"{table}_shared"
        rows = gather.output[0] if s is None else f"{prefix}_rows"
        nodes = nbits_rows(model, head, gather.input[1], rows, prefix)
        if s is not None:  # the head's rows were scaled by s: gathered s ⊙ e, divided back
            graph.initializer.append(numpy_helper.from_array((1.0 / s).astype(np.float32), f"{prefix}_unsmooth"))
            unsmooth = [rows, f"{prefix}_unsmooth"]
            nodes.append(helper.make_node("Mul", unsmooth, [gather.output[0]], name=f"{prefix}_mul"))
        at = list(graph.node).index(gather)
        graph.node.remove(gather)
        for k, node in enumerate(nodes):
            graph.node.insert(at + k, node)
        used = {i for n in graph.node for i in n.input}
        for name in [gather.input[0], *gather.input[2:]]:
            if name and name not in used and name in inits:
                graph.initializer.remove(inits.pop(name))
    return model


def plain_blocks(head: onnx.NodeProto) -> bool:
    """Whether the MatMulNBits `head` holds plain blocks along K (no g_idx), which GatherBlockQuantized reads."""
    return not (len(head.input) > 4 and head.input[4])


def nbits_rows(model: onnx.ModelProto, head: onnx.NodeProto, ids: str, out: str, prefix: str) -> list[onnx.NodeProto]:
    """The nodes (their constants added to `model`'s initializers) that write `out`: the rows `ids` (any shape) of
    Wᵀ for the weight W (K × N) the MatMulNBits `head` multiplies by, as (ids' shape, K) float32: GatherBlockQuantized
    over its codes (N, blocks, block · bits / 8), scales and zero points (plain_blocks), reshaped to K."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    hat = _attrs(head)
    bits, block, vocab, depth = hat["bits"], hat["block_size"], hat["N"], hat["K"]
    blocks = inits[head.input[1]].dims[1]
    scales = helper.make_node(
        "Reshape",
        [head.input[2], _constant(graph, f"{prefix}_scales_shape", [vocab, blocks, 1])],
        [f"{prefix}_scales"],
        name=f"{prefix}_scales_reshape",
    )
    inputs = [head.input[1], ids, f"{prefix}_scales"]
    zero = Builder(f"{prefix}_zp", default_opset(model))
    if len(head.input) > 3 and head.input[3]:  # asymmetric: one zero point a block, a byte each at session start
        per_row = int(np.prod(inits[head.input[3]].dims)) // vocab
        points = unpacked(zero, head.input[3], vocab, per_row, bits)
        if per_row * 8 // bits != blocks:  # the padding of an odd number of 4-bit zero points cut off
            points = zero.op("Slice", [points, *(zero.const(v, np.int64) for v in ([0], [blocks], [1]))])
        inputs.append(zero.op("Reshape", [points, zero.const([vocab, blocks, 1], np.int64)]))
        graph.initializer.extend(zero.inits)
    rows = f"{prefix}_blocks"
    shared = helper.make_node(
        "GatherBlockQuantized",
        inputs,
        [rows],
        name=f"{prefix}_gather",
        domain="com.microsoft",
        bits=bits,
        block_size=block,
        gather_axis=0,
        quantize_axis=2,
    )
    width = blocks * block  # K padded to whole blocks
    ids_shape = helper.make_node("Shape", [ids], [f"{prefix}_ids_shape"], name=f"{prefix}_ids_shape")
    shape = helper.make_node(
        "Concat",
        [f"{prefix}_ids_shape", _constant(graph, f"{prefix}_width", [width])],
        [f"{prefix}_shape"],
        name=f"{prefix}_shape",
        axis=0,
    )
    nodes = [*zero.nodes, scales, shared, ids_shape, shape]
    if width == depth:
        nodes.append(helper.make_node("Reshape", [rows, f"{prefix}_shape"], [out], name=f"{prefix}_reshape"))
    else:  # the padding of the last block cut off
        cut = [_constant(graph, f"{prefix}_{k}", [v]) for k, v in (("start", 0), ("end", depth), ("axis", -1))]
        whole = f"{prefix}_reshape_output"
        nodes.append(helper.make_node("Reshape", [rows, f"{prefix}_shape"], [whole], name=f"{prefix}_reshape"))
        nodes.append(helper.make_node("Slice", [whole, *cut], [out], name=f"{prefix}_slice"))
    return nodes


def _constant(graph: onnx.GraphProto, name: str, values: list[int]) -> str:
    graph.initializer.append(numpy_helper.from_array(np.array(values, dtype=np.int64), name))
    return name
