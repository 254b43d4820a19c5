"""Weights already on a 4-bit grid (a checkpoint dequantized from a 4-bit file): they are told from
others; the corrected schemes' rounding keeps their scale, so its error is constant in each block and a
correction of rank K / block takes it whole; an activation that feeds one is not smoothed; the blocks'
offsets in the graph take that error at a 16th of the codes' bytes, and the budget buys them first."""

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper

from converters.checkpoint import load_model
from converters.export import export_onnx, sample_inputs
from converters.nbits_storage import dequantize_nbits
from converters.quantization.corrections.correction import correction_bytes, error_factors
from converters.quantization.corrections.correction_plan import correction_ranks
from converters.quantization.quantize import quantize_onnx
from converters.quantization.registry import scheme_named
from converters.quantization.rounding import grid as grid_module
from converters.quantization.rounding.grid import (
    add_offsets,
    grid_matmuls,
    off_grid,
    offset_bytes,
    offset_residual,
    on_grid,
)
from converters.quantization.rounding.int4 import quantize_4bit
from tests.conftest import matmul_graph, write_tiny_bert

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


def test_a_weight_read_a_few_columns_at_a_time_is_told_so_too(monkeypatch):
    monkeypatch.setattr(grid_module, "GRID_VALUES", 64 * 5)  # five of 48 columns at a time
    grid = q4_1(64, 48)
    assert on_grid(grid, BLOCK)
    off = grid.copy()
    off[3, 47] += 0.3 * abs(grid[1, 47] - grid[0, 47]) / 15 + 1e-3  # in the last slice only
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


def test_the_blocks_offsets_in_the_graph_take_the_rounding_error_whole():
    k, n = 64, 48
    weight = q4_1(k, n)
    quantized = quantize_4bit(matmul_graph(weight), block=BLOCK, accuracy_level=0, aware=True, keep_grid=True)
    (node,) = [x for x in quantized.graph.node if x.op_type == "MatMulNBits"]
    error = weight.astype(np.float64) - dequantize_nbits(quantized.graph, node)
    before = onnx.load_from_string(quantized.SerializeToString())
    corrected = add_offsets(quantized, {"y": error}, BLOCK)
    onnx.checker.check_model(corrected)
    x = RNG.standard_normal((5, k)).astype(np.float32)
    run = {
        name: ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
        for name, m in (("4-bit", before), ("offsets", corrected))
    }
    exact = x.astype(np.float64) @ weight
    assert np.abs(run["offsets"] - exact).max() <= 0.02 * np.abs(run["4-bit"] - exact).max()
    codes = [i for i in corrected.graph.initializer if i.name == "y_offsets_codes"]
    assert codes[0].data_type == TensorProto.INT8 and tuple(codes[0].dims) == (k // BLOCK, n)
    assert offset_bytes(k, n, BLOCK) == (k * n // 2) * 2 // BLOCK + 4  # 2 / BLOCK of the 4-bit codes, one scale
    assert offset_residual(error, np.eye(k), BLOCK) < 1e-3  # on the grid the offsets leave almost nothing
    spread = RNG.standard_normal((k, n))  # an error spread over each block: its means take a block's share of it
    assert offset_residual(spread, np.eye(k), BLOCK) > 1 - 3 / BLOCK


def test_the_budget_buys_a_grid_layers_offsets_before_a_rank_and_never_spends_more():
    shapes = {"grid": (576, 576), "trained": (576, 576)}
    spectra = {name: torch.linspace(1, 0.01, 576) for name in shapes}
    offsets = {"grid": (offset_bytes(576, 576, 32), 1e-3)}
    for budget in (offsets["grid"][0], correction_bytes(576, 576, 16) + offsets["grid"][0]):
        ranks, eight, offset, _ = correction_ranks(
            spectra, {"grid": 1.0, "trained": 1.0}, shapes, budget, offsets=offsets
        )
        assert offset == ("grid",) and not eight and ranks.get("grid", 0) == 0
        assert offsets["grid"][0] + sum(correction_bytes(576, 576, r) for r in ranks.values() if r) <= budget


def test_every_grid_layers_offsets_come_first_when_the_budget_holds_them_all():
    # losses measured a layer at a time undervalue many small layers (BENCHMARKS.md, "The head's rank"): a budget
    # that holds every offset buys them all before a head's rank, one that does not weighs them as points
    shapes = {"g1": (576, 576), "g2": (576, 576), "head": (576, 256)}
    spectra = {**{g: torch.linspace(1, 0.01, 576) for g in ("g1", "g2")}, "head": 0.5 ** torch.arange(576.0)}
    losses = {"g1": 0.01, "g2": 0.01, "head": 10.0}
    size = offset_bytes(576, 576, 32)
    offsets = {g: (size, 1e-3) for g in ("g1", "g2")}
    head = correction_bytes(576, 256, 16)
    for budget, all_offsets in ((2 * size + head, True), (2 * size - 1, False)):
        ranks, eight, offset, _ = correction_ranks(
            spectra, losses, shapes, budget, offsets=offsets, ranks_only={"head"}
        )
        assert (offset == ("g1", "g2")) == all_offsets and ranks["head"] == 16 and not eight
        assert len(offset) * size + sum(correction_bytes(*shapes[n], r) for n, r in ranks.items() if r) <= budget


def test_a_corrected_model_whose_layers_sit_on_a_grid_gets_their_offsets(tmp_path):
    model, _ = load_model(write_tiny_bert(tmp_path / "bert", hidden=128, intermediate=256))
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for linear in linears:
            n, k = linear.weight.shape
            linear.weight.copy_(torch.from_numpy(q4_1(k, n).T.copy()))
    fp32 = export_onnx(model, tmp_path / "m.onnx").path
    vocab = model.get_input_embeddings().num_embeddings
    names = ("input_ids", "attention_mask")
    feeds = [dict(zip(names, (x.numpy() for x in sample_inputs(vocab, 8, 12, seed)))) for seed in range(4)]
    result = quantize_onnx(
        fp32,
        tmp_path / "c.onnx",
        scheme_named("int4-corrected")(block_size=BLOCK, correction_share=0.2),
        feeds,
        vocab=vocab,
    )
    offsets = {out: c for out, c in result.corrections.items() if "offsets" in c}
    assert len(offsets) >= len(linears) // 2, "offsets are the cheapest loss per byte a grid layer has"
    assert all(c["offsets"] in (128 // BLOCK, 256 // BLOCK) and c["loss_share_left"] < 1e-2 for c in offsets.values())
    assert 0 < result.parity_rel <= scheme_named("int4").gate
