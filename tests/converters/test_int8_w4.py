"""int8-w4 (converters/quantization/schemes/int8_w4.py): the linear layers' codes stored in 4 bits (ONNX INT4 behind
a Cast, storage/int4_cast.py) and multiplied in int8; the Cast folded exactly when the session starts; the layers
kept in int8 those whose 4 bits cost the most, within the share asked; the codes by rounding/column_int4.py;
bad options and an LM refused."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from compressor.errors import CompressorError
from converters.checkpoint import load_model
from converters.export import export_onnx
from converters.quantization.corrections.correction import relative_error
from converters.quantization.quantize import quantize_onnx
from converters.quantization.registry import scheme_named
from converters.quantization.rounding.column_int4 import column_codes
from converters.quantization.rounding.int4 import four_bit_codes
from converters.quantization.rounding.target_cpu import INT16_MAX, widest_pair
from converters.quantization.storage.int4_cast import int4_codes, int4_weights, store_int4
from eval.kinds import graph_kind
from tests.conftest import run_cli, write_tiny_lm


def _quantized(fp32, vocab, feeds, path, **options):
    config = scheme_named("int8-w4")(table_head=8, table_block=16, **options)
    return config, quantize_onnx(fp32, path, config, feeds, vocab=vocab)


def _as_int8(path, out):
    """The graph at `path` with every INT4 weight put back as the int8 initializer its Cast gives."""
    model = onnx.load(str(path))
    graph = model.graph
    for weight, held in int4_weights(graph).items():
        codes = int4_codes(graph, held)
        graph.node.remove(next(n for n in graph.node if n.op_type == "Cast" and n.input[0] == held))
        graph.initializer.remove(next(i for i in graph.initializer if i.name == held))
        graph.initializer.append(numpy_helper.from_array(codes, weight))
    onnx.save_model(model, str(out))
    return out


def test_every_linear_layer_in_4_bits_folded_exactly_into_int8_products(tiny_bert_graph, tmp_path):
    fp32, vocab, feeds = tiny_bert_graph
    config, result = _quantized(fp32, vocab, feeds, tmp_path / "w4.onnx")
    assert result.parity_rel < config.gate and result.eight_bit == ()
    graph = onnx.load(str(result.path)).graph
    products = [n for n in graph.node if n.op_type == "MatMulInteger"]
    stored = int4_weights(graph)
    assert products and all(n.input[1] in stored for n in products)  # every product's weight: 4-bit codes
    assert not [i.name for i in graph.initializer if i.data_type == TensorProto.INT8 and len(i.dims) == 2]
    plain = _as_int8(result.path, tmp_path / "int8.onnx")
    assert result.path.stat().st_size < plain.stat().st_size  # the codes take half the bytes
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    folded = ort.InferenceSession(str(result.path), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx")).graph
    assert not [i.name for i in optimized.initializer if i.data_type == TensorProto.INT4]  # folded at session start
    same = ort.InferenceSession(str(plain), providers=["CPUExecutionProvider"])
    feed = feeds[0]
    np.testing.assert_array_equal(folded.run(None, feed)[0], same.run(None, feed)[0])  # the same int8 weights


def test_the_layers_kept_in_int8_add_at_most_their_share_of_the_4_bit_bytes(tiny_bert_graph, tmp_path):
    fp32, vocab, feeds = tiny_bert_graph
    _, every = _quantized(fp32, vocab, feeds, tmp_path / "all.onnx", int8_share=1.0)
    assert not int4_weights(onnx.load(str(every.path)).graph)
    config, some = _quantized(fp32, vocab, feeds, tmp_path / "some.onnx", int8_share=0.2, target_cpu="avx2")
    graph = onnx.load(str(some.path)).graph
    stored = int4_weights(graph)
    kept = [n.input[1] for n in graph.node if n.op_type == "MatMulInteger" and n.input[1] not in stored]
    assert kept and stored and config.report(some)["eight_bit_layers"] == list(some.eight_bit)
    sizes = {i.name: int(np.prod(i.dims)) for i in graph.initializer}
    assert sum(sizes[w] for w in kept) / 2 <= 0.2 * four_bit_codes(onnx.load(str(fp32)))  # half a byte a weight more
    int8 = [numpy_helper.to_array(i) for i in graph.initializer if i.data_type == TensorProto.INT8 and len(i.dims) == 2]
    codes = [int4_codes(graph, held) for held in stored.values()]
    assert max(widest_pair(w) for w in int8 + codes) <= INT16_MAX  # avx2 sums every pair in int16 unsaturated


def test_column_codes_leave_less_output_error_than_rounding_to_nearest():
    rng = np.random.default_rng(0)
    mix = rng.normal(size=(64, 64))
    x = rng.normal(size=(512, 64)) @ mix * np.linspace(0.2, 3.0, 64)  # correlated inputs of unlike sizes
    gram = x.T @ x
    weight = rng.normal(size=(64, 32))
    codes, scales = column_codes(weight, gram)
    assert codes.dtype == np.int8 and codes.min() >= -8 and codes.max() <= 7 and scales.shape == (32,)
    step = np.abs(weight).max(axis=0) / 7
    nearest = np.clip(np.round(weight / step), -8, 7) * step
    assert relative_error(weight - codes * scales, weight, gram) < 0.8 * relative_error(weight - nearest, weight, gram)


def _held_int8(shape):
    """A graph whose one output is the int8 initializer "w" of `shape` (zeros), at opset 17."""
    weight = numpy_helper.from_array(np.zeros(shape, np.int8), "w")
    output = helper.make_tensor_value_info("w", TensorProto.INT8, list(shape))
    graph = helper.make_graph([], "g", [], [output], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_int4_behind_a_cast_gives_every_code_back(tmp_path):
    codes = np.arange(-8, 8, dtype=np.int8).repeat(3).reshape(16, 3)
    model = _held_int8(codes.shape)
    store_int4(model, "w", codes)
    assert model.opset_import[0].version == 21 and int4_weights(model.graph) == {"w": "w_int4"}
    onnx.save_model(model, str(tmp_path / "cast.onnx"))
    (back,) = ort.InferenceSession(str(tmp_path / "cast.onnx"), providers=["CPUExecutionProvider"]).run(None, {})
    np.testing.assert_array_equal(back, codes)
    with pytest.raises(ValueError, match="in \\[-9, -9\\]"):
        store_int4(_held_int8(codes.shape), "w", np.full(codes.shape, -9, np.int8))


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_a_share_out_of_range_is_refused(share):
    with pytest.raises(CompressorError, match="--int8-share is a share of the 4-bit codes' bytes, from 0 to 1"):
        scheme_named("int8-w4")(int8_share=share)


def test_an_lm_is_refused(tmp_path):
    model, _ = load_model(write_tiny_lm(tmp_path / "lm"))
    fp32 = export_onnx(model, tmp_path / "lm.onnx").path
    with pytest.raises(CompressorError, match="narrows an encoder's word table"):
        scheme_named("int8-w4")().check(graph_kind(fp32))


def test_only_the_activations_with_outliers_are_smoothed():
    """Smoothing moves a range into the weights that 4 bits round: only where one int8 scale cannot hold it."""
    absmax = {"outlying": np.array([1.0, 1.0, 1.0, 40.0]), "even": np.array([1.0, 2.0, 3.0, 20.0])}
    assert set(scheme_named("int8-w4")().channels(None, absmax)) == {"outlying"}
    assert set(scheme_named("int8-aware")().channels(None, absmax)) == {"outlying", "even"}


def test_a_share_given_to_a_scheme_that_keeps_no_layer_in_int8_is_refused(tiny_bert_dir, tmp_path, capsys):
    code, _, err = run_cli(
        capsys, "export", tiny_bert_dir, "--quantize", "int8", "--int8-share", 0.5, "--out", tmp_path / "m"
    )
    assert code == 2 and "--int8-share goes with --quantize int8-w4" in err
    assert not (tmp_path / "m").exists()
