"""Weights already on a 4-bit grid: a checkpoint dequantized from a 4-bit file (SmolLM2 from its Q4_1
GGUF) holds, in each block of `block` weights along K, at most 16 evenly spaced values w = m + d·q,
q ∈ 0…15. Smoothing would scale its rows off that grid. Asymmetric round-to-nearest keeps the step d
and misses only the minimum's offset from the integer zero point z, W − Q = m + d·z: one value per block
and column, an error of rank ≤ K / block, which a low-rank correction of that rank takes whole
(converters.quantization.correction); k-quant's search finds d on nearly every block, not all (on
SmolLM2 its error keeps 0.2–0.3% of its energy beyond rank K/32, round-to-nearest's 0.03–0.09%).
ONNX Runtime's asymmetric range takes in 0, so a block of one sign only is rounded on another step;
every block of SmolLM2's holds both.
So the corrected schemes neither smooth an activation that feeds such a weight nor search its scale;
int4-aware, which has no correction to take the offset, keeps its own rounding (on SmolLM2 it measured
better so: BENCHMARKS.md, "Weights on a 4-bit grid")."""

import numpy as np
import onnx
from onnx import numpy_helper

from converters.quantization.smoothing import smoothable

__all__ = ["GRID_TOL", "on_grid", "grid_matmuls", "off_grid"]

GRID_TOL = 1e-3  # of a level: a float32 dequantization leaves about 1e-6
LEVELS = 16


def on_grid(weight: np.ndarray, block: int) -> bool:
    """Whether every block of `block` rows of `weight` (K × N, K a multiple of `block`) holds only values
    lo + step·q, q an integer in 0…15, step = (hi − lo) / 15 of the block's own extremes."""
    k, n = weight.shape
    if k % block or not k:
        return False
    blocks = weight.astype(np.float64).reshape(k // block, block, n)
    lo, hi = blocks.min(axis=1, keepdims=True), blocks.max(axis=1, keepdims=True)
    step = (hi - lo) / (LEVELS - 1)
    levels = (blocks - lo) / np.where(step > 0, step, 1.0)
    return bool(np.all(np.abs(levels - np.round(levels)) <= GRID_TOL))


def grid_matmuls(model: onnx.ModelProto, block: int, names=None) -> set[str]:
    """The MatMul nodes (of `names`, None: all) whose constant weight lies on a 4-bit grid of `block`."""
    inits = {i.name: i for i in model.graph.initializer if len(i.dims) == 2}
    return {
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul"
        and node.input[1] in inits
        and (names is None or node.name in names)
        and on_grid(numpy_helper.to_array(inits[node.input[1]]), block)
    }


def off_grid(model: onnx.ModelProto, absmax: dict[str, np.ndarray], block: int) -> dict[str, np.ndarray]:
    """`absmax` without the activations that feed a weight on the grid: those are not smoothed."""
    graph = model.graph
    gridded = grid_matmuls(model, block)
    fed = {a for a, consumers in smoothable(graph).items() if any(graph.node[k].name in gridded for k in consumers)}
    return {a: v for a, v in absmax.items() if a not in fed}
