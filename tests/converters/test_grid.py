"""Weights already on a 4-bit grid (a checkpoint dequantized from a 4-bit file): they are told from
others; the corrected schemes' rounding keeps their scale, so its error is constant in each block and a
correction of rank K / block takes it whole; an activation that feeds one is not smoothed."""

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from converters.quantization.correction import dequantize_nbits, error_factors
from converters.quantization.grid import grid_matmuls, off_grid, on_grid
from converters.quantization.int4 import quantize_4bit
from tests.conftest import matmul_graph

RNG = np.random.default_rng(0)
BLOCK = 16


def q4_1(k: int, n: int, block: int = BLOCK) -> np.ndarray:
    """A weight (K × N) as a Q4_1 file dequantizes it: in each block, fp16 minimum m and step d, m + d·q;
    each block holds negative and positive weights, as a trained layer's blocks do."""
    q = RNG.integers(0, 16, size=(k // block, block, n))
    q[:, 0], q[:, 1] = 0, 15  # the block's own extremes, as Q4_1 sets them
    d = RNG.uniform(0.01, 0.02, size=(k // block, 1, n)).astype(np.float16).astype(np.float64)
    m = -RNG.uniform(0.02, 0.13, size=(k // block, 1, n)).astype(np.float16).astype(np.float64)
    return (m + d * q).reshape(k, n).astype(np.float32)


def test_a_dequantized_4_bit_weight_is_told_from_a_trained_one():
    grid = q4_1(64, 48)
    assert on_grid(grid, BLOCK)
    assert not on_grid(RNG.standard_normal((64, 48)).astype(np.float32), BLOCK)
    assert not on_grid(grid, 2 * BLOCK)  # two blocks' grids are not one
    assert not on_grid(grid[:40], BLOCK)  # K not a whole number of blocks
    off = grid.copy()
    off[3, 5] += 0.3 * abs(grid[1, 5] - grid[0, 5]) / 15 + 1e-3  # one weight between two levels
    assert not on_grid(off, BLOCK)


def test_its_rounding_error_is_constant_in_each_block_and_a_rank_k_over_block_correction_takes_it():
    k, n = 64, 48
    weight = q4_1(k, n)
    model = matmul_graph(weight)
    assert grid_matmuls(model, BLOCK) == {"mm"}
    quantized = quantize_4bit(model, block=BLOCK, accuracy_level=0, aware=True, keep_grid=True)
    (node,) = [x for x in quantized.graph.node if x.op_type == "MatMulNBits"]
    error = weight.astype(np.float64) - dequantize_nbits(quantized.graph, node)
    blocks = error.reshape(k // BLOCK, BLOCK, n)
    assert np.abs(blocks - blocks[:, :1]).max() <= 1e-6 * np.abs(weight).max()  # one value per block and column
    assert np.abs(error).max() > 1e-3  # the zero point's offset: a real error
    left, right, _ = error_factors(error, torch.eye(k, dtype=torch.float64), k // BLOCK)
    assert np.abs(left.astype(np.float64) @ right - error).max() <= 1e-5 * np.abs(error).max()
    trained = matmul_graph(RNG.standard_normal((k, n)).astype(np.float32) * 0.05)  # k-quant: spread over the block
    rounded = quantize_4bit(trained, block=BLOCK, accuracy_level=0, aware=True, keep_grid=True)
    (node,) = [x for x in rounded.graph.node if x.op_type == "MatMulNBits"]
    spread = numpy_helper.to_array(trained.graph.initializer[0]) - dequantize_nbits(rounded.graph, node)
    assert np.abs(spread.reshape(k // BLOCK, BLOCK, n) - spread.reshape(k // BLOCK, BLOCK, n)[:, :1]).max() > 1e-3


def test_an_activation_feeding_a_weight_on_the_grid_is_not_smoothed():
    k, n = 64, 32
    weights = {"Wg": q4_1(k, n), "Wt": RNG.standard_normal((k, n)).astype(np.float32)}
    nodes = [
        helper.make_node("MatMul", ["a", "Wg"], ["ya"], name="on_grid"),
        helper.make_node("MatMul", ["b", "Wt"], ["yb"], name="trained"),
    ]
    inputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["t", k]) for x in "ab"]
    outputs = [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["t", n]) for y in ("ya", "yb")]
    inits = [numpy_helper.from_array(w, name) for name, w in weights.items()]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits))
    onnx.checker.check_model(model)
    absmax = {"a": np.ones(k), "b": np.ones(k)}
    assert grid_matmuls(model, BLOCK) == {"on_grid"}
    assert set(off_grid(model, absmax, BLOCK)) == {"b"}
