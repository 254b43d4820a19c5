"""Low rank on the rounding error (int4-corrected): the reader of MatMulNBits' codes gives the weight
ONNX Runtime multiplies by; the output-metric fit restores the error at full rank and beats a plain
SVD of it at equal rank; the budget is never overspent, and offers a 3-bit layer 4 bits for what its own
4-bit rounding leaves; the corrected graph holds 8-bit factors and every corrected layer's output error falls,
also after the factors are rounded."""

import copy

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from compressor.budget import tail_error
from converters.checkpoint import load_model
from converters.export import export_onnx, sample_inputs
from converters.nbits_storage import dequantize_nbits
from converters.quantization.corrections import errors as rounding
from converters.quantization.corrections.correction import (
    correction_bytes,
    error_factors,
    error_spectrum,
    input_grams,
    layer_factors,
)
from converters.quantization.corrections.correction_plan import correction_ranks, plan_corrections
from converters.quantization.corrections.errors import rounding_errors
from converters.quantization.quantize import quantize_onnx
from converters.quantization.registry import scheme_named
from converters.quantization.rounding.int4 import four_bit_codes, quantize_4bit, quantize_matmuls
from converters.quantization.schemes.int4_corrected import CORRECTED_TABLE_BLOCK
from eval.graph import make_session
from tests.conftest import matmul_graph, write_tiny_bert, write_tiny_lm

RNG = np.random.default_rng(0)


def _matmul(k=64, n=48):
    weight = RNG.standard_normal((k, n)).astype(np.float32)
    return matmul_graph(weight), weight


@pytest.mark.parametrize("aware", [False, True])
def test_the_reader_gives_the_weight_onnx_runtime_multiplies_by(tmp_path, aware):
    model, weight = _matmul()
    quantized = quantize_4bit(model, block=16, accuracy_level=0, aware=aware)
    (node,) = [n for n in quantized.graph.node if n.op_type == "MatMulNBits"]
    q = dequantize_nbits(quantized.graph, node)
    onnx.save_model(quantized, str(tmp_path / "q.onnx"))
    x = RNG.standard_normal((5, 64)).astype(np.float32)
    (y,) = make_session(tmp_path / "q.onnx").run(None, {"x": x})
    assert np.abs(y - x @ q).max() <= 1e-4 * np.abs(y).max()
    assert 0.01 < np.abs(q - weight).max() < 0.5  # rounded, not the weight itself


def test_the_grams_sum_every_token_and_each_read_is_a_float64_copy_of_its_own():
    # held in float32 a Gram an input, read as float64 a layer at a time: a read changed never changes the next
    model, weight = _matmul()
    batches = [{"x": RNG.standard_normal((9, 64)).astype(np.float32)} for _ in range(3)]
    grams = input_grams(model, batches)
    (out,) = list(grams)
    x = np.concatenate([b["x"] for b in batches]).astype(np.float64)
    first = grams[out]
    assert out == "y" and "x" not in grams and len(grams) == 1 and first.dtype == torch.float64
    assert np.abs(first.numpy() - x.T @ x).max() <= 1e-5 * np.abs(x.T @ x).max()
    first += 1.0
    assert torch.equal(grams[out], first - 1.0)


def test_the_rounding_errors_are_made_on_each_read_from_the_graph_as_it_is(monkeypatch):
    monkeypatch.setattr(rounding, "ERROR_VALUES", 64 * 5)  # five of 48 columns at a time
    model, weight = _matmul()
    quantized = quantize_4bit(model, block=16, accuracy_level=0, aware=False)
    errors = rounding_errors(quantized, model)
    (out,) = list(errors)
    (node,) = [n for n in quantized.graph.node if n.op_type == "MatMulNBits"]
    assert errors.shape(out) == (64, 48) and errors[out].dtype == np.float64
    np.testing.assert_array_equal(errors[out], weight.astype(np.float64) - dequantize_nbits(quantized.graph, node))
    parts = list(errors.columns(out))
    assert len(parts) == 10 and all(part.shape[0] == 64 for part in parts)
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), errors[out])


def _anisotropic_gram(k=64, tokens=400):
    x = RNG.standard_normal((tokens, k)) * np.geomspace(10, 0.1, k)  # a few channels carry most
    return x, torch.from_numpy(x.T @ x)


def test_at_full_rank_the_correction_restores_the_error():
    error = RNG.standard_normal((64, 48)) * 0.1
    _, gram = _anisotropic_gram()
    left, right, spectrum = error_factors(error, gram, 48)
    assert left.shape == (64, 48) and right.shape == (48, 48) and spectrum.shape == (48,)
    assert np.abs(left.astype(np.float64) @ right - error).max() <= 1e-5


def _sliced_errors(n: int, monkeypatch):
    """The rounding errors of a 64 × `n` layer made 7 columns at a time, and an anisotropic Gram."""
    monkeypatch.setattr(rounding, "ERROR_VALUES", 64 * 7)
    model, _ = _matmul(64, n)
    errors = rounding_errors(quantize_4bit(model, block=16, accuracy_level=0, aware=False), model)
    _, gram = _anisotropic_gram()
    return errors, gram


@pytest.mark.parametrize("n", [24, 200])
def test_the_spectrum_is_the_whitened_error_s_singular_values_for_fewer_outputs_or_more(n, monkeypatch):
    # more outputs than inputs: σ² the eigenvalues of Sᵀ E Eᵀ S, K × K, summed over slices of E's columns
    errors, gram = _sliced_errors(n, monkeypatch)
    _, _, spectrum = error_factors(errors["y"], gram, 1)
    sliced = error_spectrum(errors, "y", gram)
    top = min(64, n)
    assert sliced.shape[0] >= top and np.all(np.diff(sliced.numpy()) <= 0)
    np.testing.assert_allclose(sliced[:top].numpy(), spectrum.numpy()[:top], rtol=1e-6, atol=1e-9 * float(spectrum[0]))
    assert np.abs(sliced[top:].numpy()).max(initial=0.0) <= 1e-6 * float(spectrum[0])


@pytest.mark.parametrize("n", [24, 200])
def test_a_layer_s_factors_from_column_slices_are_the_whole_error_s_fit(n, monkeypatch):
    errors, gram = _sliced_errors(n, monkeypatch)
    left, right, _ = error_factors(errors["y"], gram, 8)
    sliced_left, sliced_right = layer_factors(errors, "y", gram, 8)
    assert sliced_left.shape == (64, 8) and sliced_right.shape == (8, n)
    whole = left.astype(np.float64) @ right
    assert np.abs(sliced_left.astype(np.float64) @ sliced_right - whole).max() <= 1e-4 * np.abs(whole).max()
    scales = np.abs(sliced_left).max(axis=0) / np.abs(sliced_right).max(axis=1)
    np.testing.assert_allclose(scales, np.abs(left).max(axis=0) / np.abs(right).max(axis=1), rtol=1e-3)  # split so


def test_the_output_metric_fit_leaves_less_output_error_than_a_plain_svd():
    error = RNG.standard_normal((64, 48)) * 0.1
    x, gram = _anisotropic_gram()
    for rank in (4, 8, 16):
        left, right, spectrum = error_factors(error, gram, rank)
        u, s, vh = np.linalg.svd(error, full_matrices=False)
        plain = (u[:, :rank] * s[:rank]) @ vh[:rank]
        ours = np.linalg.norm(x @ (error - left.astype(np.float64) @ right))
        assert ours < 0.95 * np.linalg.norm(x @ (error - plain))
        # the spectrum predicts the output error the rank leaves
        assert ours**2 == pytest.approx(tail_error(spectrum, rank, relative=False), rel=1e-3)


def test_the_ranks_and_widths_never_spend_more_than_the_budget():
    shapes = {"a": (384, 384), "b": (384, 1536), "c": (1536, 384)}
    spectra = {n: torch.linspace(1, 0.01, min(s)) ** (i + 1) for i, (n, s) in enumerate(shapes.items())}
    losses = {"a": 1.0, "b": 0.3, "c": 3.0}
    wider = {"b": 0.2}  # b in 3 bits: 8 bits cost 5 more a weight, 4 bits one
    for budget in (0, 20_000, 50_000, 200_000, 500_000):
        ranks, eight, _, four = correction_ranks(spectra, losses, shapes, budget, wider=wider)
        widened = sum(shapes[n][0] * shapes[n][1] * (5 if n in wider else 4) // 8 for n in eight)
        widened += sum(shapes[n][0] * shapes[n][1] // 8 for n in four)
        assert sum(correction_bytes(*shapes[n], r) for n, r in ranks.items() if r) + widened <= budget
        assert not set(ranks) & set(eight) & set(four) and set(ranks) | set(eight) | set(four) == set(shapes)
        assert set(four) <= set(wider)
        assert all(
            r % 16 == 0 and correction_bytes(*shapes[n], r) < shapes[n][0] * shapes[n][1] // 2 for n, r in ranks.items()
        )
    assert ranks.get("c", 0) > 0 or "c" in eight  # the layer that loses most is served first


def test_one_budget_holds_a_spread_error_in_8_bits_and_a_concentrated_one_in_a_rank():
    shapes = {"spread": (256, 256), "concentrated": (256, 256)}
    spectra = {"spread": torch.ones(256), "concentrated": 0.5 ** torch.arange(256.0)}
    budget = 256 * 256 // 2 + correction_bytes(256, 256, 16)
    ranks, eight, _, _ = correction_ranks(spectra, {"spread": 1.0, "concentrated": 1.0}, shapes, budget)
    assert eight == ("spread",) and ranks == {"concentrated": 16}
    ranks, eight, _, _ = correction_ranks(
        spectra, {"spread": 1.0, "concentrated": 1.0}, shapes, budget, ranks_only={"spread"}
    )
    assert eight == () and ranks["concentrated"] >= 16 and ranks["spread"] > 0  # a rank, where 8 bits is not offered


def test_a_3_bit_layer_is_offered_4_bits_for_one_more_bit_a_weight_and_8_for_five():
    shapes, spectra, losses = {"spread": (256, 256)}, {"spread": torch.ones(256)}, {"spread": 1.0}
    weights = 256 * 256
    for budget, eight_bits, four_bits in ((weights // 8, (), ("spread",)), (weights // 2, (), ("spread",))):
        plan = correction_ranks(spectra, losses, shapes, budget, wider={"spread": 0.25})
        assert (plan.eight_bit, plan.four_bit) == (eight_bits, four_bits)  # 8 bits cost 5/8 of a byte a weight
    plan = correction_ranks(spectra, losses, shapes, weights * 5 // 8, wider={"spread": 0.25})
    assert plan.eight_bit == ("spread",) and plan.four_bit == ()
    plan = correction_ranks(spectra, losses, shapes, weights // 2)  # in 4 bits already: 8 bits cost 4 more
    assert plan.eight_bit == ("spread",) and plan.four_bit == ()


def test_the_plan_measures_what_4_bits_leave_of_a_3_bit_layer_error():
    k, n, block = 128, 64, 32
    model = matmul_graph(RNG.standard_normal((k, n)).astype(np.float32))
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    _, gram = _anisotropic_gram(k)
    out = model.graph.node[0].output[0]
    three, four = (quantize_matmuls(copy.deepcopy(model), block, 0, True, bits=bits) for bits in (3, 4))
    plan = plan_corrections(three, model, {out: gram}, {out: 1.0}, k * n // 8, block=block, wider=four)
    assert plan.four_bit == (out,) and not plan.ranks.get(out)  # 4 bits leave about a quarter: worth an eighth
    assert plan_corrections(three, model, {out: gram}, {out: 1.0}, k * n // 8, block=block).four_bit == ()
    kept = quantize_matmuls(copy.deepcopy(model), block, 0, True, bits=3, four_bit=("mm",))
    assert kept.SerializeToString() == four.SerializeToString()  # the layer so named not rounded again in 3 bits


def test_a_corrected_graph_holds_8_bit_factors_and_lowers_each_layer_error(tmp_path):
    # layers of 128 and 256: a rank-16 correction in 8 bits costs less than the 4 bits it saves
    model, _ = load_model(write_tiny_bert(tmp_path / "bert", hidden=128, intermediate=256))
    fp32 = export_onnx(model, tmp_path / "m.onnx").path
    vocab = model.get_input_embeddings().num_embeddings
    names = ("input_ids", "attention_mask")
    feeds = [dict(zip(names, (x.numpy() for x in sample_inputs(vocab, 8, 12, seed)))) for seed in range(4)]
    result = quantize_onnx(
        fp32,
        tmp_path / "c.onnx",
        scheme_named("int4-corrected")(block_size=16, correction_share=0.3),
        feeds,
        vocab=vocab,
    )
    assert 0 < result.parity_rel <= scheme_named("int4").gate
    assert result.corrections, "a 30% budget buys at least one correction"
    for layer in result.corrections.values():
        errors = layer["rel_output_error"]
        assert errors["corrected"] < errors["rounded"] and errors["factors_rounded"] < errors["rounded"]
        assert errors["factors_rounded"] <= 1.05 * errors["corrected"] + 1e-6  # 8 bits keep the factors
    graph = onnx.load(str(result.path)).graph
    factors = [n for n in graph.node if n.op_type == "MatMulInteger" and "_correction_" in n.name]
    assert len(factors) == 2 * len(result.corrections)  # an encoder's factors: ONNX Runtime's dynamic int8 MatMul
    codes = {i.name: i for i in graph.initializer if i.data_type == TensorProto.INT8}
    for out, layer in result.corrections.items():
        k, n = _shape(graph, out)
        assert list(codes[f"{out}_L_quantized"].dims) == [k, layer["rank"]]
        assert list(codes[f"{out}_R_quantized"].dims) == [layer["rank"], n]
    plain = [i for i in graph.initializer if i.data_type == TensorProto.FLOAT and len(i.dims) == 2 and min(i.dims) > 1]
    assert not [i.name for i in plain if i.name.endswith(("_L", "_R"))]  # no fp32 factor left
    tables = {
        helper.get_attribute_value(a)
        for n in graph.node
        if n.op_type == "GatherBlockQuantized"
        for a in n.attribute
        if a.name == "block_size"
    }
    assert tables == {CORRECTED_TABLE_BLOCK}  # the tables in their wider default block, the layers in 16
    added = sum(correction_bytes(*_shape(graph, n), layer["rank"]) for n, layer in result.corrections.items())
    widened = [n for n in graph.node if n.op_type == "MatMulNBits" and _bits(n) == 8]
    assert len(widened) == len(result.eight_bit)  # the layers the budget held in 8 bits instead
    added += sum(_attrs(n)["K"] * _attrs(n)["N"] // 2 for n in widened)
    assert added <= 0.3 * four_bit_codes(onnx.load(str(fp32)))


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _bits(node) -> int:
    return _attrs(node)["bits"]


def _shape(graph, out):
    attrs = _attrs(next(n for n in graph.node if n.output[0] == f"{out}_rounded"))
    return attrs["K"], attrs["N"]


def test_an_lm_head_gets_a_rank_not_8_bits_and_its_factors_multiply_int8_rows(tmp_path):
    # an LM decodes one token a step: its factors at accuracy level 4; its head (V outputs, the tied table's
    # codes) is offered a rank, never 8 bits
    model, _ = load_model(write_tiny_lm(tmp_path / "llama", hidden=128))
    fp32 = export_onnx(model, tmp_path / "lm.onnx").path
    vocab = model.get_input_embeddings().num_embeddings
    names = ("input_ids", "attention_mask")
    feeds = [dict(zip(names, (x.numpy() for x in sample_inputs(vocab, 4, 12, seed)))) for seed in range(4)]
    result = quantize_onnx(
        fp32,
        tmp_path / "c.onnx",
        scheme_named("int4-corrected")(block_size=16, correction_share=0.5),
        feeds,
        vocab=vocab,
    )
    graph = onnx.load(str(result.path)).graph
    head = [
        n.output[0].removesuffix("_rounded")
        for n in graph.node
        if n.op_type == "MatMulNBits" and _attrs(n)["N"] == vocab and "_correction_" not in n.name
    ]
    assert len(head) == 1 and result.corrections[head[0]]["rank"] > 0  # the logits' layer: a correction
    assert _bits(next(n for n in graph.node if n.output[0].removesuffix("_rounded") == head[0])) == 4  # not 8 bits
    errors = result.corrections[head[0]]["rel_output_error"]
    assert errors["factors_rounded"] < errors["rounded"]  # the logits nearer the fp32 graph's
    factors = [n for n in graph.node if n.op_type == "MatMulNBits" and "_correction_" in n.name]
    assert factors and all(_attrs(n)["accuracy_level"] == 4 for n in factors)
