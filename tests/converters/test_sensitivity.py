"""Each layer's 4-bit loss: the estimate from the input Gram is the output error energy the rounding
leaves in the layer (what ONNX Runtime's 4-bit graph computes, on the calibration inputs), it grows
with what flows through the layer, and the choice between measuring and estimating follows the layer
count."""

import copy

import numpy as np
import onnx
import pytest

from converters.checkpoint import load_model
from converters.export import export_onnx, sample_inputs
from converters.quantization.corrections import sensitivity
from converters.quantization.corrections.correction import input_grams
from converters.quantization.rounding.int4 import layer_losses, name_nodes, quantize_matmuls
from eval.graph import make_session
from eval.kinds import ENCODER
from tests.conftest import matmul_graph

RNG = np.random.default_rng(0)


def _matmul(k=64, n=48):
    return matmul_graph(RNG.standard_normal((k, n)).astype(np.float32))


@pytest.mark.parametrize("k, n", [(64, 48), (16, 48)])  # the probe sums the errors E (K > N), or the Gram
def test_the_estimate_is_the_output_error_energy_of_the_rounded_layer(tmp_path, k, n, monkeypatch):
    model = _matmul(k, n)
    name_nodes(model.graph)
    feeds = [{"x": (RNG.standard_normal((32, k)) * np.geomspace(5, 0.2, k)).astype(np.float32)} for _ in range(3)]
    (loss,) = sensitivity.gram_losses(model, input_grams(model, feeds), block=16, accuracy_level=0).values()
    onnx.save_model(model, str(tmp_path / "fp32.onnx"))
    onnx.save_model(quantize_matmuls(onnx.load(str(tmp_path / "fp32.onnx")), 16, 0, True), str(tmp_path / "q.onnx"))
    fp32, rounded = make_session(tmp_path / "fp32.onnx"), make_session(tmp_path / "q.onnx")
    energy = sum(float(np.sum((rounded.run(None, f)[0] - fp32.run(None, f)[0]).astype(np.float64) ** 2)) for f in feeds)
    assert abs(loss - energy) <= 1e-3 * energy
    (probed,) = sensitivity.probed_losses(model, feeds, block=16, accuracy_level=0).values()  # no Gram given
    assert abs(probed - energy) <= 1e-3 * energy
    monkeypatch.setattr(sensitivity, "SLICE_BYTES", 4 * k * 8)  # each weight rounded 8 columns at a time
    (sliced,) = sensitivity.probed_losses(model, feeds, block=16, accuracy_level=0).values()
    assert abs(sliced - probed) <= 1e-5 * probed
    louder = [{"x": 10 * f["x"]} for f in feeds]  # ten times the input: a hundred times the error energy
    (loud,) = sensitivity.gram_losses(model, input_grams(model, louder), block=16, accuracy_level=0).values()
    assert 99 < loud / loss < 101


def test_large_graphs_are_estimated_and_small_ones_measured(tiny_bert_dir, tmp_path, monkeypatch):
    model, _ = load_model(tiny_bert_dir)
    vocab = model.get_input_embeddings().num_embeddings
    graph = onnx.load(str(export_onnx(model, tmp_path / "m.onnx").path))
    name_nodes(graph.graph)
    names = ("input_ids", "attention_mask")
    feeds = [dict(zip(names, (x.numpy() for x in sample_inputs(vocab, 4, 9, seed)))) for seed in range(3)]
    measured = sensitivity.four_bit_losses(graph, feeds, ENCODER, 16, 4)
    assert measured == layer_losses(graph, feeds[: sensitivity.SENSITIVITY_BATCHES], ENCODER, 16, 4)
    monkeypatch.setattr(sensitivity, "MEASURED_LAYERS", len(measured) - 1)
    estimated = sensitivity.four_bit_losses(graph, feeds, ENCODER, 16, 4)
    assert set(estimated) == set(measured) and all(v > 0 for v in estimated.values())
    in_grams = sensitivity.gram_losses(graph, input_grams(graph, feeds), 16, 4)  # Σ ‖x E‖² = tr(Eᵀ G E)
    assert all(abs(estimated[name] - loss) <= 1e-4 * loss for name, loss in in_grams.items())
    rounded = quantize_matmuls(copy.deepcopy(graph), 16, 4, True)  # the caller's own rounding, read as it is
    assert sensitivity.four_bit_losses(graph, feeds, ENCODER, 16, 4, quantized=rounded) == estimated
