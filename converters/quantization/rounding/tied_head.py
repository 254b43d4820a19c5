"""A tied LM's table by frequency, for both of its reads: the rows of the most frequent tokens (the head) in 8
bits, the rest (the tail) in 4, in the lookup and in the logits alike, each half's codes stored once
(tied_codes). What is left of a 4-bit SmolLM2 is its tied table's rounding, and the logits of the tokens text
is made of pay it most (BENCHMARKS.md, "The tied head by frequency").

`split_tied_head` rewrites the tied pair exactly, in fp32, before quantization: the lookup as table_head's
head/tail lookup (slot = perm[id]), and the logits x Eᵀ as the two products x E_headᵀ and x E_tailᵀ, concatenated
in slot order and gathered back to token order, logits[…, id] = Concat(…)[…, perm[id]]. Each half is then a
tied pair of its own (its table and its `_transposed` copy), which the quantizers round and share as they do
one: the head's MatMul and Gather named 8-bit, the tail's 4-bit. The head costs h·D/2 bytes more than 4 bits;
scoring a batch holds two more (batch, sequence, V) tensors at the peak (the halves' logits and their
concatenation), a decode step does not feel it."""

import numpy as np
import onnx
from onnx import helper, numpy_helper

from converters.quantization.rounding.table_head import split_table
from converters.quantization.storage.tied_codes import TRANSPOSED, tied_pairs
from files.onnx_files import weight_array

__all__ = ["split_tied_head"]


def split_tied_head(model: onnx.ModelProto, head: np.ndarray) -> tuple[str, ...]:
    """Rewrite `model`'s tied table (the largest, when several) in place as the exact head/tail pair of the
    distinct token ids `head`; the names of the head's Gather and MatMul nodes, to round in 8 bits (none when
    the graph has no tied table)."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    pairs = tied_pairs(graph)
    if not pairs:
        return ()
    table = max(pairs, key=lambda name: int(np.prod(inits[name].dims)))
    gather = next(n for n in graph.node if n.op_type == "Gather" and n.input[0] == table)
    (logits,) = [n for n in graph.node if n.op_type == "MatMul" and n.input[1] == table + TRANSPOSED]
    head_gather, _ = split_table(model, gather, head)
    prefix = gather.output[0]
    transposed = weight_array(inits[table + TRANSPOSED])  # D × V
    perm = f"{prefix}_perm"  # split_table's: token id → slot, head tokens first
    slots = weight_array(next(i for i in graph.initializer if i.name == perm)).astype(np.int64)
    order = np.argsort(slots)  # slot → token id
    h = len(head)
    out = logits.output[0]
    nodes = []
    for part, ids in (("head", order[:h]), ("tail", order[h:])):
        weight = f"{prefix}_{part}_table{TRANSPOSED}"
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(transposed[:, ids]), weight))
        nodes.append(helper.make_node("MatMul", [logits.input[0], weight], [f"{out}_{part}"], name=f"{out}_{part}"))
    nodes += [
        helper.make_node("Concat", [f"{out}_head", f"{out}_tail"], [f"{out}_slots"], name=f"{out}_slots", axis=-1),
        helper.make_node("Cast", [perm], [f"{out}_perm"], name=f"{out}_perm", to=onnx.TensorProto.INT64),
        helper.make_node("Gather", [f"{out}_slots", f"{out}_perm"], [out], name=f"{out}_by_token", axis=-1),
    ]
    at = list(graph.node).index(logits)
    graph.node.remove(logits)
    for k, node in enumerate(nodes):
        graph.node.insert(at + k, node)
    graph.initializer.remove(inits[table + TRANSPOSED])
    return head_gather, f"{out}_head"  # split_table names each Gather as its output
