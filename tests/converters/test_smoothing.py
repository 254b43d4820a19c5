"""int8-aware: SmoothQuant's scaling is exact in fp32, evens out the calibration ranges it was
fitted to, and the graph it quantizes has int8 weights within the int8 tolerance of its fp32 graph."""

import numpy as np
import onnx
import pytest

from compressor.errors import CompressorError
from converters.checkpoint import load_model
from converters.export import export_onnx, sample_inputs
from converters.quantization.quantize import is_quantized, quantize_onnx
from converters.quantization.registry import scheme_named
from converters.quantization.rounding.smoothing import activation_absmax, smooth, smoothable, smoothed
from eval.graph import make_session
from files.onnx_files import load_onnx


@pytest.fixture(scope="module")
def graph(tiny_bert_dir, tmp_path_factory):
    model, _ = load_model(tiny_bert_dir)
    path = export_onnx(model, tmp_path_factory.mktemp("smooth") / "m.onnx").path
    vocab = model.get_input_embeddings().num_embeddings
    batches = [
        {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
        for ids, mask in (sample_inputs(vocab, 4, 16, seed) for seed in (5, 6))
    ]
    return path, vocab, batches


def _outputs(proto: onnx.ModelProto, tmp_path, feeds) -> list[np.ndarray]:
    path = tmp_path / "smoothed.onnx"
    onnx.save_model(proto, str(path))
    session = make_session(path)
    return [session.run(["last_hidden_state"], feed)[0] for feed in feeds]


def test_smoothing_is_exact_in_fp32_and_evens_out_the_ranges(graph, tmp_path):
    path, _, batches = graph
    proto = onnx.load(str(path))
    absmax = activation_absmax(proto, batches)
    groups = smoothable(proto.graph)
    assert len(groups) == 2 * 4  # per layer: q/k/v share one input; attention output, FFN in, FFN out
    assert max(len(nodes) for nodes in groups.values()) == 3
    assert set(absmax) == set(groups) and {a.shape for a in absmax.values()} == {(48,), (96,)}
    muls = sum(n.op_type == "Mul" for n in proto.graph.node)
    reference = [make_session(path).run(["last_hidden_state"], feed)[0] for feed in batches]
    for alpha in (0.5, 1.0):
        smoothed = smooth(proto, absmax, alpha)
        assert sum(n.op_type == "Mul" for n in smoothed.graph.node) == muls + len(groups)
        for y, y_s in zip(reference, _outputs(smoothed, tmp_path, batches)):
            np.testing.assert_allclose(y_s, y, atol=2e-5)
    # α = 1: s_j = max|x_j|, so every smoothed channel peaks at exactly 1 on the calibration batches
    smoothed = smooth(proto, absmax, 1.0)
    after = activation_absmax(smoothed, batches)
    for name, peak in absmax.items():
        smoothed_peak = after[f"{name}/smoothed"]
        live = peak > 0
        np.testing.assert_allclose(smoothed_peak[live], 1.0, rtol=1e-5)
        assert peak[live].max() / peak[live].min() > 1.5  # the ranges were uneven before


def test_the_smoothed_graph_written_a_weight_at_a_time_is_the_one_built_in_memory(graph):
    path, _, batches = graph
    proto = onnx.load(str(path))
    built = smooth(proto, activation_absmax(proto, batches), 0.8)
    written, _ = smoothed(lambda: load_onnx(path), batches, 0.8)  # through a file beside it and back
    assert written.SerializeToString() == built.SerializeToString()


def test_int8_aware_quantizes_every_weight_within_tolerance(graph, tmp_path):
    path, vocab, batches = graph
    result = quantize_onnx(path, tmp_path / "aware.onnx", scheme_named("int8-aware")(), batches, vocab=vocab)
    assert 0 < result.parity_rel <= scheme_named("int8").gate and is_quantized(result.path)
    proto = onnx.load(str(result.path))
    big = [i for i in proto.graph.initializer if np.prod(i.dims) >= 48 * 48]
    assert big and all(i.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8) for i in big)
    assert sum(n.op_type == "MatMulInteger" for n in proto.graph.node) == 2 * 6


def test_int8_aware_without_calibration_is_refused(graph, tmp_path):
    path, vocab, _ = graph
    with pytest.raises(CompressorError, match="needs calibration batches"):
        quantize_onnx(path, tmp_path / "aware.onnx", scheme_named("int8-aware")(), vocab=vocab)
    assert not (tmp_path / "aware.onnx").exists()
