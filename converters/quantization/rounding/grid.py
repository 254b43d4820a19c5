"""Weights already on a 4-bit grid: a checkpoint dequantized from a 4-bit file (SmolLM2 from its Q4_1
GGUF) holds, in each block of `block` weights along K, at most 16 evenly spaced values w = m + d·q,
q ∈ 0…15. Smoothing would scale its rows off that grid. Asymmetric round-to-nearest keeps the step d
and misses only the minimum's offset from the integer zero point z, W − Q = m + d·z: one value per block
and column, an error of rank ≤ K / block, which a low-rank correction of that rank takes whole
(converters.quantization.corrections.correction); k-quant's search finds d on nearly every block, not all (on
SmolLM2 its error keeps 0.2–0.3% of its energy beyond rank K/32, round-to-nearest's 0.03–0.09%).
ONNX Runtime's asymmetric range takes in 0, so a block of one sign only is rounded on another step;
every block of SmolLM2's holds both.
The offsets themselves are the correction a grid needs: E = B O, B the K × K / block 0/1 matrix of the blocks,
so x E = (x B) O, the block sums of x times O (K / block × N, int8): a 16th of the 4-bit codes' bytes,
against (K + N)·K / block for a rank-K / block correction (`add_offsets`; the budget buys them first when it
holds them all, else offers them beside the ranks: correction_plan.correction_ranks). On SmolLM2, its table in 4
bits, the linear layers so rounded and offset keep the perplexity of exact ones within 0.2% (BENCHMARKS.md,
"Offsets for weights on a 4-bit grid").
So the corrected schemes neither smooth an activation that feeds such a weight nor search its scale;
int4-aware, which has no correction to take the offset, keeps its own rounding (on SmolLM2 it measured
better so: BENCHMARKS.md, "Weights on a 4-bit grid")."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from converters.quantization.rounding.smoothing import smoothable
from files.onnx_files import weight_array

__all__ = [
    "GRID_TOL",
    "on_grid",
    "grid_matmuls",
    "off_grid",
    "block_offsets",
    "stored_offsets",
    "offset_bytes",
    "offset_residual",
    "add_offsets",
]

GRID_TOL = 1e-3  # of a level: a float32 dequantization leaves about 1e-6
LEVELS = 16
GRID_VALUES = 1 << 20  # weights read at once by on_grid


def on_grid(weight: np.ndarray, block: int) -> bool:
    """Whether every block of `block` rows of `weight` (K × N, K a multiple of `block`) holds only values
    lo + step·q, q an integer in 0…15, step = (hi − lo) / 15 of the block's own extremes; read GRID_VALUES at a time,
    up to the first slice off it (an LM's head whole in fp64 and its levels were 4 GB at 0.5B)."""
    k, n = weight.shape
    if k % block or not k:
        return False
    step = max(1, GRID_VALUES // k)
    return all(_columns_on_grid(weight[:, at : at + step], block) for at in range(0, n, step))


def _columns_on_grid(weight: np.ndarray, block: int) -> bool:
    k, n = weight.shape
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
        and on_grid(weight_array(inits[node.input[1]]), block)
    }


def off_grid(model: onnx.ModelProto, absmax: dict[str, np.ndarray], block: int) -> dict[str, np.ndarray]:
    """`absmax` without the activations that feed a weight on the grid: those are not smoothed."""
    graph = model.graph
    gridded = grid_matmuls(model, block)
    fed = {a for a, consumers in smoothable(graph).items() if any(graph.node[k].name in gridded for k in consumers)}
    return {a: v for a, v in absmax.items() if a not in fed}


def block_offsets(error: np.ndarray, block: int) -> np.ndarray:
    """O (K / block × N): the mean of `error` (W − Q, K × N) over each block of `block` rows, the rounding's
    whole error on a grid, where E = B O with B the K × K / block indicator of the blocks (x E = (x B) O)."""
    k, n = error.shape
    return error.reshape(k // block, block, n).mean(axis=1)


def stored_offsets(offsets: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """`offsets` as written: int8 codes c and one scale s (symmetric, s = max |O| / 127), O ≈ s·c."""
    scale = np.float32(max(np.abs(offsets).max(), 1e-30) / 127)
    return np.clip(np.round(offsets / scale), -127, 127).astype(np.int8), scale


def offset_bytes(k: int, n: int, block: int) -> int:
    """The file bytes of a layer's offsets: K / block × N int8 codes and one fp32 scale."""
    return (k // block) * n + 4


def offset_residual(error: np.ndarray, gram: np.ndarray, block: int) -> float:
    """The share of the output error energy tr(Eᵀ G E) that E − B O leaves, O as stored (stored_offsets)."""
    codes, scale = stored_offsets(block_offsets(error, block))
    residual = error - np.repeat(codes.astype(np.float64) * scale, block, axis=0)
    total = np.sum((gram @ error) * error)
    return float(np.sum((gram @ residual) * residual) / total) if total > 0 else 0.0


def add_offsets(model: onnx.ModelProto, errors: dict[str, np.ndarray], block: int) -> onnx.ModelProto:
    """`model` (changed in place) in which each MatMulNBits layer of `errors` (output name → W − Q) computes
    MatMulNBits(x) + (x B) O: the block sums x B, one MatMul by a 0/1 matrix shared by the layers of one
    input, then O stored as int8 (stored_offsets) and cast back by constant nodes ONNX Runtime folds when the
    session starts."""
    graph = model.graph
    heads, added, sums, indicators = [], {}, {}, set()
    for node in [n for n in graph.node if n.op_type == "MatMulNBits" and n.output[0] in errors]:  # in graph order
        out = node.output[0]
        k, _ = errors[out].shape
        indicator = f"grid_blocks_{k}_{block}"
        if indicator not in indicators:
            indicators.add(indicator)
            ones = np.repeat(np.eye(k // block, dtype=np.uint8), block, axis=0)
            graph.initializer.append(numpy_helper.from_array(ones, indicator + "_codes"))
            heads.append(helper.make_node("Cast", [indicator + "_codes"], [indicator], to=TensorProto.FLOAT))
        codes, scale = stored_offsets(block_offsets(errors[out], block))
        stored = {"codes": codes, "scale": scale}
        graph.initializer.extend(numpy_helper.from_array(v, f"{out}_offsets_{part}") for part, v in stored.items())
        heads += [
            helper.make_node("Cast", [f"{out}_offsets_codes"], [f"{out}_offsets_float"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [f"{out}_offsets_float", f"{out}_offsets_scale"], [f"{out}_offsets"]),
        ]
        x, new = node.input[0], []
        if (x, indicator) not in sums:
            sums[x, indicator] = f"{x}_block_sums_{block}"
            new.append(helper.make_node("MatMul", [x, indicator], [sums[x, indicator]], name=sums[x, indicator]))
        node.output[0] = f"{out}_rounded"
        new += [
            helper.make_node("MatMul", [sums[x, indicator], f"{out}_offsets"], [f"{out}_xO"], name=f"{out}_offset"),
            helper.make_node("Add", [f"{out}_rounded", f"{out}_xO"], [out], name=f"{out}_offset_added"),
        ]
        added[node.name] = new
    nodes = [*heads, *(m for n in graph.node for m in [n, *added.get(n.name, [])])]
    del graph.node[:]
    graph.node.extend(nodes)
    return model
