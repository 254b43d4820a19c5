"""A model whose FFN down-projections read a few channels 50× the rest (as a 110M MPNet's do): ONNX Runtime's
one-line int8 fails its gate and is kept only where asked (the report's baseline row, marked); int8-aware's
smoothing takes the outliers into the weights, passes the gate, keeps cosine ≥ 0.99 to the fp32 graph and names
the layers that read them."""

import numpy as np
import pytest
import torch

from compressor.errors import ExportParityError
from converters.checkpoint import load_model
from converters.export import export_onnx, sample_inputs
from converters.quantization.quantize import quantize_onnx
from converters.quantization.registry import scheme_named
from converters.quantization.rounding.smoothing import OUTLIER_RATIO
from eval.graph import make_session
from eval.probe import full_feed
from tests.conftest import write_tiny_bert

NAMES = ("input_ids", "attention_mask")
OUTLYING, FACTOR, GAIN = 3, 50.0, 30.0  # channels, how much larger, the other channels' weights' gain


@pytest.fixture(scope="module")
def outlying(tmp_path_factory):
    """The tiny BERT with OUTLYING intermediate channels FACTOR× the rest (their weights scaled down as much, so
    the output is as before), its FFN output made to matter (GAIN); its fp32 graph, vocab, calibration and held-out
    batches."""
    path = write_tiny_bert(tmp_path_factory.mktemp("bert") / "bert", hidden=64, intermediate=128)
    model, _ = load_model(path)
    with torch.no_grad():
        for layer in model.encoder.layer:
            layer.intermediate.dense.weight[:OUTLYING] *= FACTOR
            layer.intermediate.dense.bias[:OUTLYING] += FACTOR
            layer.output.dense.weight[:, :OUTLYING] /= FACTOR
            layer.output.dense.weight[:, OUTLYING:] *= GAIN
    vocab = model.get_input_embeddings().num_embeddings
    feeds = [dict(zip(NAMES, (x.numpy() for x in sample_inputs(vocab, 8, 12, seed)))) for seed in range(6)]
    return export_onnx(model, path.parent / "m.onnx").path, vocab, feeds[:4], feeds[4:]


def _cosine(fp32, quantized, feeds) -> float:
    a, b = make_session(fp32), make_session(quantized)
    cosines = []
    for feed in feeds:
        (y,) = a.run(None, full_feed(a, feed))
        (y_q,) = b.run(None, full_feed(b, feed))
        y, y_q = y.reshape(-1, y.shape[-1]), y_q.reshape(-1, y_q.shape[-1])
        cosines.append(np.mean((y * y_q).sum(1) / np.linalg.norm(y, axis=1) / np.linalg.norm(y_q, axis=1)))
    return float(np.mean(cosines))


def test_plain_int8_fails_its_gate_and_is_kept_marked_only_when_asked(outlying, tmp_path):
    fp32, vocab, calibration, _ = outlying
    with pytest.raises(ExportParityError, match="int8 graph .* off its fp32 graph"):
        quantize_onnx(fp32, tmp_path / "int8.onnx", scheme_named("int8")(), calibration, vocab=vocab)
    assert not (tmp_path / "int8.onnx").exists()
    kept = quantize_onnx(
        fp32, tmp_path / "int8.onnx", scheme_named("int8")(), calibration, vocab=vocab, keep_failed=True
    )
    assert kept.path.is_file() and "off its fp32 graph" in kept.gate_failed and kept.parity_rel > 0.35


def test_int8_aware_smooths_the_outliers_passes_its_gate_and_names_their_layers(outlying, tmp_path):
    fp32, vocab, calibration, held_out = outlying
    result = quantize_onnx(fp32, tmp_path / "aware.onnx", scheme_named("int8-aware")(), calibration, vocab=vocab)
    assert result.gate_failed is None and result.parity_rel < 0.35
    assert _cosine(fp32, result.path, held_out) >= 0.99
    assert len(result.outliers) == 2 and min(result.outliers.values()) >= OUTLIER_RATIO  # each layer's FFN down
