"""A table in 3 bits: its rows cut into blocks of `block` columns, w ≈ s · (q − z) with q, z in [0, 8), s in
half precision, one s and z a block (the range [min(w, 0), max(w, 0)], round to nearest). ONNX Runtime's
GatherBlockQuantized runs 2, 4 and 8 bits, not 3, so the lookup is a subgraph of standard operators over two
bit planes, q = lo + 4 · hi (lo 2 bits, four to a byte; hi 1 bit, eight to a byte; packed_codes' layout):
Gather the rows of each plane, scale and zero point, unpack those rows alone (a mask each code), then
(q − z) · s. 3.375 bits a weight in blocks of 64 against 4.31 for 4 bits; on MiniLM's word table a 4-bit head of
the 4,096 most frequent rows and a 3-bit tail keep recall@10 0.955 / 0.941 (the table alone; BENCHMARKS.md,
"The word table in 3 bits")."""

import numpy as np
import onnx

from compressor.errors import CompressorError
from converters.nbits_storage import pack
from converters.quantization.storage.packed_codes import Builder, default_opset, replace_gather
from files.onnx_files import weight_array

__all__ = [
    "THREE_BIT_PARTS",
    "three_bit_gather",
    "three_bit_rows",
    "three_bit_outputs",
]

THREE_BIT_PARTS = ("Q3lo", "Q3hi", "scales3", "zero_points3")  # initializers OUT_part of a 3-bit lookup
_LEVELS = 7


def _codes(weight: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes (rows, cols) uint8, scales (rows, cols / block) float16, zero points uint8) of `weight`."""
    rows, cols = weight.shape
    blocks = weight.reshape(rows, cols // block, block)
    low, high = np.minimum(blocks.min(-1), 0), np.maximum(blocks.max(-1), 0)
    scale = ((high - low) / _LEVELS).astype(np.float16)
    safe = np.where(scale > 0, scale, 1).astype(np.float32)
    zero = np.clip(np.round(-low / safe), 0, _LEVELS)
    codes = np.clip(np.round(blocks / safe[..., None]) + zero[..., None], 0, _LEVELS)
    return codes.reshape(rows, cols).astype(np.uint8), scale, zero.astype(np.uint8)


def _plane(b: Builder, packed: str, per_row: int, bits: int, weight: float) -> str:
    """(n, per_row · 8 / bits) floats `weight` · code of the (n, per_row) uint8 plane `packed` (pack's layout):
    code k of a byte is (byte AND m_k) / 2^(k · bits), m_k its bits' mask; three operators for the whole plane."""
    per = 8 // bits
    masks = b.const([((1 << bits) - 1) << (k * bits) for k in range(per)], np.uint8)
    weights = b.const([weight / (1 << (k * bits)) for k in range(per)], np.float32)
    parts = b.op("BitwiseAnd", [b.op("Reshape", [packed, b.const([-1, per_row, 1], np.int64)]), masks])
    codes = b.op("Mul", [b.op("Cast", [parts], to=onnx.TensorProto.FLOAT), weights])
    return b.op("Reshape", [codes, b.const([-1, per_row * per], np.int64)])


def three_bit_gather(model: onnx.ModelProto, name: str, block: int) -> None:
    """The Gather node `name` of a 2-D fp32 table (in place) as the 3-bit lookup (module docstring), its
    output unchanged; its table removed when no other node reads it."""
    graph = model.graph
    node = next(n for n in graph.node if n.name == name)
    inits = {i.name: i for i in graph.initializer}
    weight = weight_array(inits[node.input[0]]).astype(np.float32)
    rows, cols = weight.shape
    if cols % block or block % 8:
        raise CompressorError(f"a 3-bit table's rows split into blocks of {block} (a multiple of 8); {cols} do not")
    codes, scale, zero = _codes(weight, block)
    out = node.output[0]
    stored = dict(zip(THREE_BIT_PARTS, (pack(codes & 3, 2), pack(codes >> 2, 1), scale, zero)))
    b = Builder(out, default_opset(model))
    flat = b.op("Reshape", [node.input[1], b.const([-1], np.int64)])
    gathered = {part: b.op("Gather", [f"{out}_{part}", flat]) for part in THREE_BIT_PARTS}
    q = b.op("Add", [_plane(b, gathered["Q3lo"], cols // 4, 2, 1), _plane(b, gathered["Q3hi"], cols // 8, 1, 4)])
    q = b.op("Reshape", [q, b.const([-1, cols // block, block], np.int64)])
    axis = b.const([-1], np.int64)
    s, z = (
        b.op("Unsqueeze", [b.op("Cast", [gathered[part]], to=onnx.TensorProto.FLOAT), axis])
        for part in THREE_BIT_PARTS[2:]
    )
    replace_gather(graph, node, b, b.op("Mul", [b.op("Sub", [q, z]), s]), stored)


def three_bit_rows(graph: onnx.GraphProto, out: str) -> np.ndarray | None:
    """The table (rows × cols, float32) the 3-bit lookup of output `out` reads its rows from, as the graph
    computes them; None when `out` is no such lookup's."""
    inits = {i.name: i for i in graph.initializer}
    if not all(f"{out}_{part}" in inits for part in THREE_BIT_PARTS):
        return None
    low, high, scale, zero = (weight_array(inits[f"{out}_{part}"]) for part in THREE_BIT_PARTS)
    rows, blocks = scale.shape
    bits = [
        (plane[..., None] >> (np.arange(8 // w) * w).astype(np.uint8)) & ((1 << w) - 1)
        for plane, w in ((low, 2), (high, 1))
    ]
    q = bits[0].reshape(rows, -1).astype(np.float32) + bits[1].reshape(rows, -1).astype(np.float32) * np.float32(4)
    q = q.reshape(rows, blocks, -1)
    values = (q - zero[..., None].astype(np.float32)) * scale[..., None].astype(np.float32)
    return values.reshape(rows, -1)


def three_bit_outputs(graph: onnx.GraphProto) -> set[str]:
    """The outputs of the 3-bit lookups in `graph`."""
    suffix = f"_{THREE_BIT_PARTS[0]}"
    return {i.name.removesuffix(suffix) for i in graph.initializer if i.name.endswith(suffix)}
