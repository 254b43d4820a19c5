"""int8 stacked on an exported graph: int8 weights where the fp32 ones were, the output within the
stated tolerance of the fp32 graph, and the refusals."""

import numpy as np
import onnx
import pytest

import converters.quantize as quantize
from compressor.errors import CompressorError, ExportParityError
from converters.checkpoint import load_model
from converters.compress import compress_
from converters.export import export_onnx
from converters.methods.tt import TTConfig
from converters.plan import Plan
from converters.quantize import REL_TOL, is_quantized, quantize_onnx


@pytest.mark.parametrize("plan", [None, Plan((("embeddings", TTConfig(rank=4)),))])
def test_int8_weights_and_output_within_tolerance(tiny_bert_dir, tmp_path, plan):
    model, _ = load_model(tiny_bert_dir)
    if plan is not None:
        compress_(model, plan, progress=False)
    fp32 = export_onnx(model, tmp_path / "m.onnx").path
    vocab = model.get_input_embeddings().num_embeddings
    result = quantize_onnx(fp32, tmp_path / "m-int8.onnx", vocab)
    assert 0 < result.parity_rel <= REL_TOL["int8"] and is_quantized(result.path) and not is_quantized(fp32)
    big = [i for i in onnx.load(str(result.path)).graph.initializer if np.prod(i.dims) >= 48 * 48]
    eight_bit = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)  # tables behind a Gather come out uint8
    assert big and all(i.data_type in eight_bit for i in big)  # every large weight, cores too
    assert result.path.stat().st_size < 0.75 * fp32.stat().st_size  # a tiny graph: its structure weighs too


def test_a_quantized_graph_is_not_quantized_again(tiny_bert_dir, tmp_path):
    model, _ = load_model(tiny_bert_dir)
    fp32 = export_onnx(model, tmp_path / "m.onnx").path
    once = quantize_onnx(fp32, tmp_path / "once.onnx", 100).path
    with pytest.raises(CompressorError, match="already quantized"):
        quantize_onnx(once, tmp_path / "twice.onnx", 100)
    with pytest.raises(CompressorError, match="scheme is one of int8"):
        quantize_onnx(fp32, tmp_path / "x.onnx", 100, scheme="int3")
    assert not (tmp_path / "twice.onnx").exists() and not (tmp_path / "x.onnx").exists()


def test_a_graph_off_its_fp32_output_is_refused_and_not_written(tiny_bert_dir, tmp_path, monkeypatch):
    model, _ = load_model(tiny_bert_dir)
    fp32 = export_onnx(model, tmp_path / "m.onnx").path
    monkeypatch.setattr(quantize, "_parity", lambda *args: (3.0, 0.9))
    with pytest.raises(ExportParityError, match="relative"):
        quantize_onnx(fp32, tmp_path / "bad.onnx", 100)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
