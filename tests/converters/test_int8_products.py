"""4-bit codes, int8 products (w4a8): the subgraph ONNX Runtime folds at session start gives each layer the int8
weight round((Q + L R) / s) of its stored codes and factors, the file keeps the codes, the student rounds its
inputs as DynamicQuantizeLinear does, and the scheme runs end to end on an encoder and refuses an LM."""

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from compressor.corrected_linear import CorrectedLinear
from compressor.errors import CompressorError
from converters.checkpoint import load_model
from converters.export import export_onnx, sample_inputs
from converters.finetune import Distillation, finetune_
from converters.finetune.config import FinetuneConfig
from converters.nbits_storage import dequantize_nbits
from converters.quantization.corrections.correction import _stored_factor, corrected_layers
from converters.quantization.corrections.int8_products import INT8_INPUT_TOL, INT8_LEVEL, int8_layers, int8_products
from converters.quantization.corrections.training import int8_rounded, trainer
from converters.quantization.quantize import quantize_onnx
from converters.quantization.registry import scheme_named
from converters.quantization.rounding.target_cpu import INT16_MAX, int8_level, reduces_range, widest_pair
from converters.quantization.rounding.three_bit_table import three_bit_outputs
from eval.graph import make_session
from eval.kinds import graph_kind
from tests.conftest import WORDS, matmul_graph, write_tiny_bert, write_tiny_lm
from texts.tokens import load_tokenizer

NAMES = ("input_ids", "attention_mask")


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny BERT wide enough for rank-16 corrections, its fp32 graph, calibration batches, and its
    int4-corrected graph (blocks of 16, a 30% budget)."""
    path = write_tiny_bert(tmp_path_factory.mktemp("bert") / "bert", hidden=128, intermediate=256)
    model, _ = load_model(path)
    fp32 = export_onnx(model, path.parent / "m.onnx").path
    vocab = model.get_input_embeddings().num_embeddings
    feeds = [dict(zip(NAMES, (x.numpy() for x in sample_inputs(vocab, 8, 12, seed)))) for seed in range(4)]
    corrected = quantize_onnx(
        fp32,
        path.parent / "c.onnx",
        scheme_named("int4-corrected")(block_size=16, correction_share=0.3),
        feeds,
        vocab=vocab,
    )
    return model, fp32, vocab, feeds, corrected.path


def _folded(model: onnx.ModelProto, tmp_path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each DynamicQuantizeMatMul's (int8 weight, scales) as ONNX Runtime computes them from the file."""
    layers = [n for n in model.graph.node if n.op_type == "DynamicQuantizeMatMul"]
    probe = copy.deepcopy(model)
    del probe.graph.output[:]
    for node in layers:
        probe.graph.output.extend(
            [
                helper.make_tensor_value_info(node.input[1], TensorProto.INT8, None),
                helper.make_tensor_value_info(node.input[2], TensorProto.FLOAT, None),
            ]
        )
    onnx.save_model(probe, str(tmp_path / "probe.onnx"))
    session = make_session(tmp_path / "probe.onnx")
    feed = {i.name: np.ones((1, 4), np.int64) for i in session.get_inputs()}
    values = session.run(None, feed)
    return {node.output[0]: (values[2 * k], values[2 * k + 1]) for k, node in enumerate(layers)}


def test_each_layer_multiplies_by_its_codes_and_correction_rounded_to_int8(bert, tmp_path):
    *_, corrected_path = bert
    corrected = onnx.load(str(corrected_path))
    layers = {n.output[0]: n for n in corrected.graph.node if n.op_type == "MatMulNBits"}
    fixed = corrected_layers(corrected)
    assert fixed, "a 30% budget buys at least one correction"
    products = int8_products(copy.deepcopy(corrected))
    ops = [n.op_type for n in products.graph.node]
    assert "MatMulNBits" not in ops and "MatMulInteger" not in ops
    folded = _folded(products, tmp_path)
    assert sorted(folded) == sorted(layers)  # one int8 product a layer
    for out, node in layers.items():
        weight = dequantize_nbits(corrected.graph, node)
        base = out.removesuffix("_rounded")
        if base in fixed:
            left, right = (_stored_factor(corrected.graph, base, side, "int8") for side in ("left", "right"))
            weight = weight + left @ right
        codes, scales = folded[out]
        assert codes.shape == weight.shape and scales.shape == (weight.shape[1],)
        np.testing.assert_allclose(scales, np.abs(weight).max(0) / INT8_LEVEL, rtol=1e-5)
        assert np.abs(codes * scales.astype(np.float64) - weight).max() <= 0.5001 * scales.max()  # one rounding
    stored = {i.name: i for i in products.graph.initializer}
    weights = [
        i
        for i in stored.values()
        if i.data_type == TensorProto.INT8 and i.name.endswith(("_L_quantized", "_R_quantized"))
    ]
    assert len(weights) == 2 * len(fixed)  # the factors as stored
    big_int8 = [i for i in stored.values() if i.data_type == TensorProto.INT8 and np.prod(i.dims) >= 128 * 128]
    assert not big_int8  # the file keeps 4-bit codes: the int8 weights exist only once the session folds them


def test_the_layers_left_out_keep_their_4_bit_product_and_correction(bert, tmp_path):
    *_, corrected_path = bert
    corrected = onnx.load(str(corrected_path))
    fixed = sorted(corrected_layers(corrected))
    chosen, left = frozenset(fixed[::2]), fixed[1::2]
    products = int8_products(copy.deepcopy(corrected), chosen)
    ops = {n.output[0]: n.op_type for n in products.graph.node}
    named = {n.name: n.op_type for n in products.graph.node}
    assert sorted(o for o, op in ops.items() if op == "DynamicQuantizeMatMul") == sorted(f"{o}_rounded" for o in chosen)
    for out in left:  # Q x (+ b) + (x L) R as before
        assert ops[f"{out}_rounded"] == "MatMulNBits" and named[f"{out}_corrected"] == "Add"
    for out in chosen:
        assert named[f"{out}_corrected"] == "Identity"  # the correction is in the int8 weight


def test_a_layer_whose_input_one_scale_does_not_hold_stays_4_bit(tmp_path):
    rng = np.random.default_rng(0)
    model = matmul_graph(rng.standard_normal((64, 48)).astype(np.float32))
    plain = rng.standard_normal((16, 64)).astype(np.float32)
    spiked = plain.copy()
    spiked[0, 0] = 1000.0  # one activation 300 × the others: one int8 step swallows them
    assert int8_layers(model, [{"x": plain}]) == {"y"}
    assert int8_layers(model, [{"x": spiked}]) == frozenset()
    assert INT8_INPUT_TOL < 0.1


def test_onnx_runtime_folds_the_expansion_at_session_start(bert, tmp_path):
    *_, corrected_path = bert
    products = int8_products(onnx.load(str(corrected_path)))
    onnx.save_model(products, str(tmp_path / "p.onnx"))
    make_session(tmp_path / "p.onnx", optimized_path=tmp_path / "optimized.onnx")
    left = {n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node}
    assert "DynamicQuantizeMatMul" in left
    assert not left & {"BitShift", "Round", "ReduceMax", "MatMulNBits", "MatMulInteger"}  # all folded or gone


def test_the_student_rounds_inputs_as_dynamic_quantize_linear_does(tmp_path):
    x = torch.randn(3, 7, 16) * torch.linspace(0.1, 4, 16)
    s = torch.linspace(0.5, 2, 16)
    x.requires_grad_(True)
    rounded = int8_rounded(x, s)
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "scale", "zero"])
    back = helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"])
    graph = helper.make_graph(
        [node, back],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "q.onnx"))
    session = make_session(tmp_path / "q.onnx")
    (expected,) = session.run(None, {"x": (x / s).detach().numpy()})
    scale = float((x / s).detach().abs().max()) / 127
    assert np.abs(rounded.detach().numpy() - expected * s.numpy()).max() <= 1e-3 * scale * float(s.max())
    assert 0 < (rounded - x).abs().max() <= scale * float(s.max())  # rounded, by at most one step
    rounded.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))  # straight through


def _in_order(graph: onnx.GraphProto) -> bool:
    """Whether every node reads only initializers, graph inputs and outputs of nodes before it."""
    known = {i.name for i in graph.initializer} | {i.name for i in graph.input} | {""}
    for node in graph.node:
        if not set(node.input) <= known:
            return False
        known.update(node.output)
    return True


@pytest.mark.parametrize("table_bits, scale_bits, linear_bits", [(4, 16, 4), (3, 8, 3)])
def test_w4a8_end_to_end_and_its_refusal_of_an_lm(bert, tmp_path, table_bits, scale_bits, linear_bits):
    model, fp32, vocab, feeds, _ = bert
    seen = []
    result = quantize_onnx(
        fp32,
        tmp_path / "w.onnx",
        scheme_named("w4a8")(
            block_size=16,
            correction_share=0.3,
            table_head=16,
            table_bits=table_bits,
            scale_bits=scale_bits,
            linear_bits=linear_bits,
        ),
        feeds,
        vocab=vocab,
        train=trainer(model, seen.append),
    )
    assert (
        0 < result.parity_rel <= scheme_named("w4a8").gate and result.corrections and result.linear_bits == linear_bits
    )
    graph = onnx.load(str(result.path)).graph
    assert {n.op_type for n in graph.node} >= {"DynamicQuantizeMatMul", "GatherBlockQuantized"} and _in_order(graph)
    assert bool(three_bit_outputs(graph)) == (table_bits == 3)  # the word table's tail in 3 bits
    assert any(i.name.endswith("_scale_codes") for i in graph.initializer) == (scale_bits == 8)
    assert any(i.name.endswith("_hi") for i in graph.initializer) == (linear_bits == 3)  # 3-bit codes' planes
    products = {n.output[0].removesuffix("_rounded") for n in graph.node if n.op_type == "DynamicQuantizeMatMul"}
    assert products == set(result.int8_layers)  # the report names the layers multiplied in int8
    (student,) = seen
    hooked = [m for m in student.modules() if m._forward_pre_hooks]
    assert len(hooked) == len([n for n in graph.node if n.op_type == "DynamicQuantizeMatMul"])
    feed = feeds[1]
    (y,) = make_session(result.path).run(None, feed)
    with torch.no_grad():
        ids, mask = (torch.from_numpy(feed[n]) for n in NAMES)
        rounding = student(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
        for module in hooked:
            module._forward_pre_hooks.clear()
        plain = student(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
    scale = np.abs(y).max()
    assert np.abs(rounding - plain).max() > 1e-4 * scale  # the hooks round each layer's input
    assert np.abs(rounding - y).max() <= 2e-2 * scale  # and the student computes what the graph does

    lm, _ = load_model(write_tiny_lm(tmp_path / "llama", hidden=128))
    lm_graph = export_onnx(lm, tmp_path / "lm.onnx").path
    with pytest.raises(CompressorError, match="use int4-trained for an LM"):
        scheme_named("w4a8")().check(graph_kind(lm_graph))  # what the pipeline asks before any work


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine")
def test_w4a8_trains_on_a_gpu_and_its_graph_computes_the_trained_student(bert, tmp_path):
    """Item 4's GPU path: the student (its input-rounding hooks too) trains on cuda, comes back to the CPU, and the
    graph written from it computes what it computes."""
    model, fp32, vocab, feeds, _ = bert
    texts = [" ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 12)) for i in range(1, 60)]
    cfg = FinetuneConfig(steps=20, seconds=None, linear_lr=1e-3, eval_every=10, batch_size=8, device="cuda")
    tokenizer, reports, students = load_tokenizer(Path(fp32).parent / "bert"), [], []

    def fit(student):
        reports.append(
            finetune_(Distillation(student, model, tokenizer, texts[:48], texts[48:], (CorrectedLinear,)), cfg)
        )
        students.append(student)

    result = quantize_onnx(
        fp32,
        tmp_path / "w.onnx",
        scheme_named("w4a8")(block_size=16, correction_share=0.3),
        feeds,
        vocab=vocab,
        train=trainer(model, fit),
    )
    (report,), (student,) = reports, students
    assert report.device.startswith("cuda") and report.steps == 20 and next(student.parameters()).device.type == "cpu"
    (y,) = make_session(result.path).run(None, feeds[1])
    with torch.no_grad():
        ids, mask = (torch.from_numpy(feeds[1][n]) for n in NAMES)
        trained = student(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
    assert np.abs(trained - y).max() <= 2e-2 * np.abs(y).max()


@pytest.mark.parametrize("target", ["avx2", "avx512_vnni"])
def test_no_pair_of_products_leaves_int16_on_a_target_that_sums_pairs_there(bert, tmp_path, target):
    # from the folded tensors alone, whatever CPU runs the test: avx2's int8 weights keep to 7 bits
    *_, corrected_path = bert
    products = int8_products(onnx.load(str(corrected_path)), level=int8_level(target))
    widest = max(widest_pair(weight) for weight, _ in _folded(products, tmp_path).values())
    assert (widest <= INT16_MAX) == reduces_range(target)
