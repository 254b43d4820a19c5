"""The ONNX nodes that build a subgraph over codes narrower than a byte (packed as converters.nbits_storage
packs them): `Builder` (nodes and constants under one prefix) and `unpacked` (the codes back as one uint8 each,
by masks and shifts on bytes). int8_products folds a layer's codes into int8 weights with them; three_bit_table
gathers a table's rows and unpacks only those."""

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["Builder", "unpacked", "default_opset", "replace_gather"]


class Builder:
    """Nodes and constants appended under one prefix; `opset`: the graph's default-domain version."""

    def __init__(self, prefix: str, opset: int):
        self.prefix, self.opset, self.nodes, self.inits, self.count = prefix, opset, [], [], 0

    def const(self, value, dtype) -> str:
        name = f"{self.prefix}_c{len(self.inits)}"  # short: a layer's subgraph holds some twenty names
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], domain: str = "", out: str | None = None, **attrs) -> str:
        """A node `op_type` of `inputs`; its output `out` (None: a fresh name under the prefix)."""
        self.count += 1
        out = out or f"{self.prefix}_{self.count}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, domain=domain, **attrs))
        return out

    def reduce(self, op_type: str, x: str) -> str:
        """`op_type` (ReduceMax, ReduceMin) of a (N, blocks, block) tensor over its last two axes: (N,)."""
        if self.opset >= 18:
            return self.op(op_type, [x, self.const([1, 2], np.int64)], keepdims=0)
        return self.op(op_type, [x], axes=[1, 2], keepdims=0)


def replace_gather(graph: onnx.GraphProto, node: onnx.NodeProto, b: Builder, values: str, stored: dict) -> None:
    """The Gather `node` (of a 2-D table, ids of any shape) replaced in `graph` by `b`'s nodes, whose `values`
    (n, …) become its output reshaped to (ids' shape, D), and the arrays `stored` as initializers OUT_part; its
    table removed when no other node reads it."""
    out, cols = node.output[0], next(i.dims[1] for i in graph.initializer if i.name == node.input[0])
    shape = b.op("Concat", [b.op("Shape", [node.input[1]]), b.const([cols], np.int64)], axis=0)
    b.op("Reshape", [values, shape], out=out)
    at = list(graph.node).index(node)
    graph.node.remove(node)
    for k, new in enumerate(b.nodes):
        graph.node.insert(at + k, new)
    graph.initializer.extend([*b.inits, *(numpy_helper.from_array(v, f"{out}_{p}") for p, v in stored.items())])
    if not any(node.input[0] in n.input for n in graph.node):
        graph.initializer.remove(next(i for i in graph.initializer if i.name == node.input[0]))


def unpacked(b: Builder, packed: str, rows: int, per_row: int, bits: int) -> str:
    """uint8 codes `bits` wide, packed as `pack` packs them, as a (rows, per_row · 8 // bits) uint8 tensor
    (rows −1: as many as there are): each byte masked and shifted against a vector of its codes' positions, one
    BitwiseAnd and one BitShift broadcast (opset 18), so that a folding holds few copies of the codes."""
    packed = b.op("Reshape", [packed, b.const([rows, per_row, 1], np.int64)])
    if bits < 8:
        per = 8 // bits
        masks = b.const([((1 << bits) - 1) << (j * bits) for j in range(per)], np.uint8)
        shifts = b.const([j * bits for j in range(per)], np.uint8)
        packed = b.op("BitShift", [b.op("BitwiseAnd", [packed, masks]), shifts], direction="RIGHT")
    return b.op("Reshape", [packed, b.const([rows, per_row * (8 // bits)], np.int64)])


def default_opset(model: onnx.ModelProto) -> int:
    """The version of the default domain `model` imports."""
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
