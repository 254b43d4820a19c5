"""The word table by frequency: its most frequent rows (the head) in 8 bits, the rest in 4, so that the
tokens text is made of pay the least rounding; with a 3-bit table (three_bit_table), the
head in 4 bits and the rest in 3.

`split_table` rewrites a table's Gather(W, ids) exactly, in fp32, as the head/tail lookup of
compressor.head_tail: slot = perm[ids] (head tokens first; perm stored in int16 up to 32,768 rows), head rows
H[min(slot, h − 1)], tail rows T[max(slot − h, 0)], Where(slot < h). `eight_bit_gather` then stores H as ONNX
Runtime's GatherBlockQuantized with bits=8 (asymmetric, one scale and uint8 zero point per block of `block`
columns), which ONNX Runtime's weight-only quantizer does not write (its Gather path is 4-bit only);
T goes through the same 4-bit path as every other table. The head costs h·D/2 bytes more than 4 bits
and the map V·2 (or 4) bytes."""

import numpy as np
import onnx
from onnx import helper, numpy_helper

from compressor.errors import CompressorError
from files.onnx_files import weight_array

__all__ = [
    "TABLE_HEAD",
    "HEAD_SUFFIX",
    "TAIL_SUFFIX",
    "word_table",
    "split_table",
    "eight_bit_gather",
    "split_tables",
    "frequent_ids",
]

# Rows of the word table kept in 8 bits under the data-aware 4-bit schemes by default: none. On
# all-MiniLM-L6-v2 2,048 rows lift the 4-bit table alone (recall@10 0.965 → 0.986 on pydoc) but not
# int4-aware (0.890 / 0.895 both ways) or int4-trained (BENCHMARKS.md, "The word table by frequency").
TABLE_HEAD = 0
HEAD_SUFFIX, TAIL_SUFFIX = "_head", "_tail"  # of the split lookup's two Gathers' outputs


def word_table(graph: onnx.GraphProto, tables: set[str], block: int) -> onnx.NodeProto | None:
    """The Gather among `tables` (node names) that reads a graph input's ids, its rows a whole number of
    blocks of `block` columns: the word embedding (or its low-rank codes); None when none does."""
    inputs = {i.name for i in graph.input}
    shapes = {i.name: tuple(i.dims) for i in graph.initializer}
    found = [n for n in graph.node if n.name in tables and n.input[1] in inputs and shapes[n.input[0]][1] % block == 0]
    return max(found, key=lambda n: np.prod(shapes[n.input[0]]), default=None)


def split_table(model: onnx.ModelProto, node: onnx.NodeProto, head: np.ndarray) -> tuple[str, str]:
    """Rewrite the Gather `node` of `model` (in place) as the exact head/tail lookup of the distinct
    token ids `head`; (head Gather's name, tail Gather's name)."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    weight = weight_array(inits[node.input[0]])
    rows, h = weight.shape[0], len(head)
    head = np.asarray(head, dtype=np.int64)
    if len(np.unique(head)) != h or not ((head >= 0) & (head < rows)).all() or not 0 < h < rows:
        raise CompressorError(f"a table's head is between 1 and {rows - 1} distinct ids in [0, {rows}), got {h}")
    is_head = np.zeros(rows, bool)
    is_head[head] = True
    tail = np.flatnonzero(~is_head)
    perm = np.empty(rows, np.int16 if rows <= np.iinfo(np.int16).max + 1 else np.int32)  # half the bytes when it can
    perm[head], perm[tail] = np.arange(h), np.arange(h, rows)
    out, ids = node.output[0], node.input[1]

    def name(part: str) -> str:
        return f"{out}_{part}"

    graph.initializer.extend(
        [
            numpy_helper.from_array(weight[head], name("head_table")),
            numpy_helper.from_array(weight[tail], name("tail_table")),
            numpy_helper.from_array(perm, name("perm")),
            numpy_helper.from_array(np.array(h, np.int32), name("h")),
            numpy_helper.from_array(np.array(h - 1, np.int32), name("last")),
            numpy_helper.from_array(np.array(0, np.int32), name("zero")),
            numpy_helper.from_array(np.array([-1], np.int64), name("axis")),
        ]
    )
    steps = [  # (op, inputs, output part, attributes); each node named as its output
        ("Gather", [name("perm"), ids], "stored_slot", {}),
        ("Cast", [name("stored_slot")], "slot", {"to": onnx.TensorProto.INT32}),
        ("Less", [name("slot"), name("h")], "is_head", {}),
        ("Unsqueeze", [name("is_head"), name("axis")], "mask", {}),
        ("Min", [name("slot"), name("last")], "head_slot", {}),
        ("Sub", [name("slot"), name("h")], "shifted", {}),
        ("Max", [name("shifted"), name("zero")], "tail_slot", {}),
        ("Gather", [name("head_table"), name("head_slot")], HEAD_SUFFIX[1:], {}),
        ("Gather", [name("tail_table"), name("tail_slot")], TAIL_SUFFIX[1:], {}),
    ]
    nodes = [helper.make_node(op, inputs, [name(part)], name=name(part), **at) for op, inputs, part, at in steps]
    rows = [name("mask"), out + HEAD_SUFFIX, out + TAIL_SUFFIX]
    nodes.append(helper.make_node("Where", rows, [out], name=name("where")))
    at = list(graph.node).index(node)
    graph.node.remove(node)
    for k, new in enumerate(nodes):
        graph.node.insert(at + k, new)
    if not any(node.input[0] in n.input for n in graph.node):  # a tied head may still read the whole table
        graph.initializer.remove(inits[node.input[0]])
    return out + HEAD_SUFFIX, out + TAIL_SUFFIX


def eight_bit_gather(model: onnx.ModelProto, name: str, block: int) -> None:
    """The Gather node `name` of a 2-D fp32 table (in place) as GatherBlockQuantized, bits=8: each row cut
    into blocks of `block` columns, w ≈ scale · (q − z), q and z uint8, the range [min(w, 0), max(w, 0)]."""
    graph = model.graph
    node = next(n for n in graph.node if n.name == name)
    inits = {i.name: i for i in graph.initializer}
    weight = weight_array(inits[node.input[0]]).astype(np.float32)
    rows, cols = weight.shape
    if cols % block:
        raise CompressorError(f"an 8-bit table's rows split into blocks of {block}; its {cols} columns do not")
    blocks = weight.reshape(rows, cols // block, block)
    low, high = np.minimum(blocks.min(-1), 0), np.maximum(blocks.max(-1), 0)
    scale = ((high - low) / 255).astype(np.float32)
    safe = np.where(scale > 0, scale, 1)
    zero = np.clip(np.round(-low / safe), 0, 255)
    codes = np.clip(np.round(blocks / safe[..., None]) + zero[..., None], 0, 255).astype(np.uint8)
    table = node.input[0]
    graph.initializer.remove(inits[table])
    graph.initializer.extend(
        [
            numpy_helper.from_array(codes.reshape(rows, cols), f"{table}_Q8"),
            numpy_helper.from_array(scale, f"{table}_scales"),
            numpy_helper.from_array(zero.astype(np.uint8), f"{table}_zero_points"),
        ]
    )
    quantized = helper.make_node(
        "GatherBlockQuantized",
        [f"{table}_Q8", node.input[1], f"{table}_scales", f"{table}_zero_points"],
        list(node.output),
        name=name,
        domain="com.microsoft",
        bits=8,
        block_size=block,
        gather_axis=0,
        quantize_axis=1,
    )
    graph.node.insert(list(graph.node).index(node), quantized)
    graph.node.remove(node)


def split_tables(graph: onnx.GraphProto) -> dict[str, tuple[onnx.NodeProto, onnx.NodeProto, np.ndarray]]:
    """The tables `split_table` rewrote: Where output → (head lookup node, tail lookup node, perm (V,))."""
    inits = {i.name: i for i in graph.initializer}
    makers = {n.output[0]: n for n in graph.node}
    found = {}
    for node in graph.node:
        out = node.output[0]
        if node.op_type == "Where" and out + HEAD_SUFFIX in makers and f"{out}_perm" in inits:
            perm = weight_array(inits[f"{out}_perm"])
            found[out] = (makers[out + HEAD_SUFFIX], makers[out + TAIL_SUFFIX], perm)
    return found


def frequent_ids(
    feeds: list[dict], rows: int, k: int = TABLE_HEAD, frequencies: np.ndarray | None = None
) -> np.ndarray:
    """The (at most) `k` token ids most frequent in the batches `feeds` (input_ids where attention_mask
    is 1), or by `frequencies` (rows,) when given (the whole calibration text's counts blended with the
    prior: converters.pipeline.calibrating.token_frequencies), each seen at least once, most frequent first."""
    if frequencies is None:
        ids = np.concatenate([f["input_ids"][f["attention_mask"].astype(bool)].ravel() for f in feeds])
        frequencies = np.bincount(ids[(ids >= 0) & (ids < rows)], minlength=rows)
    order = np.argsort(-frequencies[:rows], kind="stable")[: min(k, rows - 1)]
    return order[frequencies[order] > 0]
