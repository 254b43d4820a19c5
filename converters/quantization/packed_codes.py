"""Codes narrower than a byte, packed `8 // bits` to a byte low bits first (MatMulNBits' layout), and the
ONNX nodes that build a subgraph over them: `Builder` (nodes and constants under one prefix) and `unpacked`
(the codes back as one uint8 each, by masks and shifts on bytes). int8_products folds a layer's codes into int8
weights with them; three_bit_table gathers a table's rows and unpacks only those. `nbits_grid` reads a
MatMulNBits node's codes with their scales and zero points."""

from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

from converters.quantization.half_scales import scale_values

__all__ = ["Builder", "NBitsGrid", "nbits_grid", "pack", "unpack", "unpacked", "default_opset", "replace_gather"]


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


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """(rows, n) codes in [0, 2^bits), n a multiple of 8 // bits, as (rows, n · bits / 8) uint8: code j in
    byte j // (8 // bits), at bit (j mod (8 // bits)) · bits."""
    per = 8 // bits
    rows, n = codes.shape
    groups = codes.astype(np.uint8).reshape(rows, n // per, per)
    shifts = (np.arange(per) * bits).astype(np.uint8)
    return np.bitwise_or.reduce(groups << shifts, axis=-1).astype(np.uint8)


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """Codes packed as `pack` packs them, `8 // bits` to a byte, unpacked along the last axis (numpy)."""
    per = 8 // bits
    codes = np.stack([(packed.astype(np.int64) >> (bits * j)) & ((1 << bits) - 1) for j in range(per)], axis=-1)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * per)


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
