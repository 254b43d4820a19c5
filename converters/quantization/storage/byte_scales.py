"""The 4-bit weights' block scales in one byte: each MatMulNBits row's scales s (one an output column's
block of inputs) on a log grid between the row's smallest and largest, s ≈ exp(a + u · d), u a uint8 (255: a
block of zeros, scale 0), a and d fp16 per row, u computed after a and d are rounded. An fp16 scale costs 2
bytes a block, this one 1 and 4 bytes a row: on MiniLM in blocks of 32 (12 and 48 blocks a row) 0.25 MB, 0.003×
its fp32 file; the grid's step is ln(max / min) / 254, a relative change of at most half of it (some 1%)
against the 4-bit rounding's 2⁻⁴. The graph computes s from u, a and d by nodes ONNX Runtime folds into a
constant when the session starts, as it folds half_scales' Casts. Tables keep half_scales: a table's row has
3 to 12 blocks, too few to pay for its a and d."""

import numpy as np
import onnx
from onnx import numpy_helper

from converters.quantization.storage.packed_codes import Builder, default_opset

__all__ = ["SCALE_BITS", "ZERO_CODE", "byte_scales", "byte_scale_values"]

SCALE_BITS = (16, 8)  # --scale-bits: fp16 (half_scales), or one byte on a log grid
ZERO_CODE = 255  # the code of a zero scale (a block of zeros)
PARTS = ("scale_codes", "scale_low", "scale_step")  # initializers NAME_part of a byte scale


def _codes(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(u (rows, blocks) uint8, a (rows, 1) fp16, d (rows, 1) fp16) of positive-or-zero `scales` (rows, blocks)."""
    positive = scales > 0
    logs = np.log(np.where(positive, scales, 1.0)).astype(np.float64)
    low = np.where(positive, logs, np.inf).min(1, keepdims=True)
    high = np.where(positive, logs, -np.inf).max(1, keepdims=True)
    low[~np.isfinite(low)], high[~np.isfinite(high)] = 0.0, 0.0  # a row of zeros
    a = low.astype(np.float16)
    d = np.maximum((high - a.astype(np.float64)) / (ZERO_CODE - 1), 2.0**-14).astype(np.float16)
    u = np.clip(np.round((logs - a.astype(np.float64)) / d.astype(np.float64)), 0, ZERO_CODE - 1)
    return np.where(positive, u, ZERO_CODE).astype(np.uint8), a, d


def byte_scale_values(codes: np.ndarray, low: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The float32 scales the graph computes from (u, a, d): exp(a + u · d), 0 where u is ZERO_CODE."""
    u = codes.astype(np.float32)
    values = np.exp(low.astype(np.float32) + u * step.astype(np.float32))
    return (values * (codes < ZERO_CODE)).astype(np.float32)


def byte_scales(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (changed in place) with each float32 MatMulNBits scales initializer S (N · blocks values, none
    negative) stored as S_scale_codes, S_scale_low, S_scale_step and computed back as S by folded nodes."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    built = []
    for index, node in enumerate(n for n in graph.node if n.op_type == "MatMulNBits"):
        name = node.input[2]
        init = inits.get(name)
        if init is None or init.data_type != onnx.TensorProto.FLOAT:
            continue
        n = next(a.i for a in node.attribute if a.name == "N")
        values = numpy_helper.to_array(init)
        scales = values.reshape(n, -1).astype(np.float64)
        if (scales < 0).any() or not np.isfinite(scales).all():
            continue
        u, a, d = _codes(scales)
        stored = dict(zip(PARTS, (u, a, d)))
        graph.initializer.remove(init)
        graph.initializer.extend(numpy_helper.from_array(v, f"{name}_{part}") for part, v in stored.items())
        b = Builder(f"bs{index}", default_opset(model))
        floats = {part: b.op("Cast", [f"{name}_{part}"], to=onnx.TensorProto.FLOAT) for part in PARTS}
        exp = b.op(
            "Exp", [b.op("Add", [floats["scale_low"], b.op("Mul", [floats["scale_codes"], floats["scale_step"]])])]
        )
        kept = b.op("Less", [floats["scale_codes"], b.const(ZERO_CODE - 0.5, np.float32)])
        kept = b.op("Cast", [kept], to=onnx.TensorProto.FLOAT)
        b.op("Reshape", [b.op("Mul", [exp, kept]), b.const(list(values.shape), np.int64)], out=name)
        built.append(b)
    nodes = [*(n for b in built for n in b.nodes), *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(i for b in built for i in b.inits)
    return model
