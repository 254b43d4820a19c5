"""GPTQ's rounding (Frantar et al., ICLR 2023) on a MatMulNBits layer's own block grid. Round to nearest picks
each code alone and leaves ‖W − Q‖ small; GPTQ picks the codes of W's K rows (each an input feature) one after
another and spreads each row's rounding error e_k over the rows not yet rounded, W_{j>k} −= e_k U_{k,j} / U_{k,k}
(U the upper Cholesky factor of H⁻¹, H the input's Gram Σ xᵀx, damped), so that the layer's output error
tr((W − Q)ᵀ H (W − Q)) falls instead. The scales and zero points are the ones rounding to nearest chose (a
block's range); only the codes change, so the graph, its bytes and its kernels stay as they were. The corrected
schemes round every layer so (quantize._corrected) but those whose weights sit on a 4-bit grid: rounded to nearest,
their error is one offset a block, which the offsets take back whole (grid.py), and GPTQ's is not. A tied head's
codes are its lookup's too, and on SmolLM2 its output error is most of what 4 bits lose (BENCHMARKS.md, "GPTQ's
rounding of the tied head"); on MiniLM's 3-bit linear layers GPTQ lifts recall@10 from 0.819 / 0.822 to 0.857 /
0.833 ("GPTQ on every layer off a grid")."""

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from tqdm.auto import tqdm

from converters.nbits_storage import nbits_grid, pack
from converters.quantization.rounding.int4 import weight_names
from converters.quantization.rounding.three_bit_linear import three_bit_layers

__all__ = ["DAMP", "gptq_codes", "gptq_rounded"]

DAMP = 0.01  # H + DAMP · mean(diag H) · I: GPTQ's damping, which keeps H⁻¹'s Cholesky factor finite
COLUMNS = 128  # rows of W rounded between two updates of the rest (GPTQ's lazy batches)
ROW_BYTES = 1 << 26  # W's outputs rounded at once, in bytes of fp64: an LM's head (Qwen2.5-0.5B's 151,936 × 896) and
# its block values repeated over its weights were 5 GB at once


def gptq_codes(
    weight: np.ndarray, gram: np.ndarray, scales: np.ndarray, zero: np.ndarray, bits: int, block: int = 1
) -> np.ndarray:
    """The codes (N × K, integers in [0, 2^bits), int16) of `weight` (K × N: y = x W) on the grid of `scales` and
    `zero` (N × ⌈K / block⌉: a value a block of `block` inputs; 1, a value a weight), chosen by GPTQ under the input
    Gram `gram` (K × K), ROW_BYTES of W's outputs at a time: an output's codes never move another's."""
    h = torch.from_numpy(np.asarray(gram, dtype=np.float64)).clone()
    dead = h.diagonal() <= 0  # inputs never seen: whatever they round to costs nothing
    h[dead, dead] = 1.0
    h += DAMP * h.diagonal().mean() * torch.eye(h.shape[0], dtype=torch.float64)
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    k, n = weight.shape
    codes = np.empty((n, k), np.int16)
    rows = max(1, ROW_BYTES // (8 * k))
    for first in range(0, n, rows):
        part = slice(first, first + rows)
        codes[part] = _row_codes(weight[:, part], u, scales[part], zero[part], bits, block)
    return codes


def _row_codes(weight: np.ndarray, u: torch.Tensor, scales: np.ndarray, zero: np.ndarray, bits: int, block: int):
    """gptq_codes of some of the outputs, `u` the upper Cholesky factor of their shared damped H⁻¹."""
    w = torch.from_numpy(np.ascontiguousarray(weight.T, dtype=np.float64)).clone()  # n × K: one column an input
    s = torch.from_numpy(np.asarray(scales, dtype=np.float64))
    z = torch.from_numpy(np.asarray(zero, dtype=np.float64))
    steps = torch.where(s != 0, s, torch.ones_like(s))  # a block's scale may be negative (symmetric: max / −8)
    top = float((1 << bits) - 1)
    codes = torch.empty_like(w)
    k = w.shape[1]
    for start in range(0, k, COLUMNS):
        end = min(start + COLUMNS, k)
        errors = torch.empty(w.shape[0], end - start, dtype=torch.float64)
        for j in range(start, end):
            b = j // block
            q = torch.where(s[:, b] != 0, torch.round(w[:, j] / steps[:, b] + z[:, b]).clamp(0, top), z[:, b])
            codes[:, j] = q
            e = (w[:, j] - (q - z[:, b]) * s[:, b]) / u[j, j]
            w[:, j + 1 : end] -= e[:, None] * u[j, j + 1 : end][None, :]
            errors[:, j - start] = e
        w[:, end:] -= errors @ u[start:end, end:]
    return codes.numpy().astype(np.int16)


def gptq_rounded(
    quantized: onnx.ModelProto, fp32: onnx.ModelProto, grams: dict[str, torch.Tensor], outputs: frozenset[str]
) -> onnx.ModelProto:
    """`quantized` (the graph `fp32` with its MatMuls in MatMulNBits; changed in place) with the codes of the
    layers `outputs` (output names, as `grams` is keyed) chosen by GPTQ on their own grid (8 levels where a
    4-bit layer's codes hold 3 bits: three_bit_linear)."""
    graph = quantized.graph
    three = {node.name for node in three_bit_layers(quantized)}
    inits = {i.name: i for i in graph.initializer}
    weights = {i.name: i for i in fp32.graph.initializer}
    names = weight_names(fp32.graph)
    nodes = [n for n in graph.node if n.op_type == "MatMulNBits" and n.output[0] in outputs]
    for node in tqdm(nodes, desc="GPTQ's rounding", unit="layer", leave=False):
        grid = nbits_grid(graph, node)
        weight = numpy_helper.to_array(weights[names[node.output[0]]])
        codes = grid.codes  # its own copy, unpacked
        bits = 3 if node.name in three else grid.bits
        codes[:, : grid.k] = gptq_codes(weight, grams[node.output[0]].numpy(), grid.scales, grid.zero, bits, grid.block)
        shape = inits[node.input[1]].dims
        inits[node.input[1]].CopyFrom(numpy_helper.from_array(pack(codes, grid.bits).reshape(shape), node.input[1]))
    return quantized
