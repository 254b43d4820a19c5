"""int8 stacked on an exported graph: int8 weights where the fp32 ones were, the output within the
stated tolerance of the fp32 graph, and the refusals."""

import numpy as np
import onnx
import pytest

import converters.quantization.quantize as quantize
from compressor.errors import CompressorError, ExportParityError
from converters.checkpoint import load_model
from converters.compress import compress_
from converters.export import export_onnx
from converters.methods.tt import TTConfig
from converters.plan import Plan
from converters.quantization.quantize import is_quantized, quantize_onnx
from converters.quantization.registry import scheme_named


@pytest.mark.parametrize("plan", [None, Plan((("embeddings", TTConfig(rank=4)),))])
def test_int8_weights_and_output_within_tolerance(tiny_bert_dir, tmp_path, plan):
    model, _ = load_model(tiny_bert_dir)
    if plan is not None:
        compress_(model, plan, progress=False)
    fp32 = export_onnx(model, tmp_path / "m.onnx").path
    vocab = model.get_input_embeddings().num_embeddings
    result = quantize_onnx(fp32, tmp_path / "m-int8.onnx", scheme_named("int8")(), vocab=vocab)
    assert 0 < result.parity_rel <= scheme_named("int8").gate and is_quantized(result.path) and not is_quantized(fp32)
    big = [i for i in onnx.load(str(result.path)).graph.initializer if np.prod(i.dims) >= 48 * 48]
    eight_bit = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)  # tables behind a Gather come out uint8
    assert big and all(i.data_type in eight_bit for i in big)  # every large weight, cores too
    assert result.path.stat().st_size < 0.75 * fp32.stat().st_size  # a tiny graph: its structure weighs too


def test_a_quantized_graph_is_not_quantized_again(tiny_bert_dir, tmp_path):
    model, _ = load_model(tiny_bert_dir)
    fp32 = export_onnx(model, tmp_path / "m.onnx").path
    once = quantize_onnx(fp32, tmp_path / "once.onnx", scheme_named("int8")(), vocab=100).path
    with pytest.raises(CompressorError, match="already quantized"):
        quantize_onnx(once, tmp_path / "twice.onnx", scheme_named("int8")(), vocab=100)
    with pytest.raises(CompressorError, match="scheme is one of int8"):
        quantize_onnx(fp32, tmp_path / "x.onnx", scheme_named("int3")(), vocab=100)
    assert not (tmp_path / "twice.onnx").exists() and not (tmp_path / "x.onnx").exists()


def test_a_graph_off_its_fp32_output_is_refused_and_not_written(tiny_bert_dir, tmp_path, monkeypatch):
    model, _ = load_model(tiny_bert_dir)
    fp32 = export_onnx(model, tmp_path / "m.onnx").path
    monkeypatch.setattr(quantize, "_parity", lambda *args: (3.0, 0.9, "random ids"))
    with pytest.raises(ExportParityError, match="relative"):
        quantize_onnx(fp32, tmp_path / "bad.onnx", scheme_named("int8")(), vocab=100)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_tied_head_becomes_a_matmul_the_quantizer_takes(tiny_llama_dir, tmp_path):
    """A tied LM's head is FusedMatMul(h, W, transB=1) in fp32 (W stored once); before quantizing it
    is MatMul(h, Wᵀ), exact in fp32, and comes out int8 like every other weight."""
    import onnxruntime as ort

    from converters.export import sample_inputs
    from converters.quantization.rounding.products import products_as_matmul
    from eval.probe import full_feed

    model, _ = load_model(tiny_llama_dir)
    fp32 = export_onnx(model, tmp_path / "lm.onnx").path
    proto = onnx.load(str(fp32))
    assert [n.op_type for n in proto.graph.node].count("FusedMatMul") == 1
    rewritten = products_as_matmul(onnx.load(str(fp32)))
    assert "FusedMatMul" not in {n.op_type for n in rewritten.graph.node}
    vocab, dim = model.get_input_embeddings().weight.shape
    shapes = sorted(tuple(i.dims) for i in rewritten.graph.initializer if vocab in i.dims)
    assert shapes == [(dim, vocab), (vocab, dim)]  # the table for the Gather, its transpose for the MatMul
    ids, mask = sample_inputs(vocab, 2, 5, 0)
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    sessions = [ort.InferenceSession(p.SerializeToString()) for p in (proto, rewritten)]
    before, after = (s.run(["logits"], full_feed(s, feed))[0] for s in sessions)
    np.testing.assert_allclose(after, before, atol=1e-5)
    result = quantize_onnx(fp32, tmp_path / "lm-int8.onnx", scheme_named("int8")(), vocab=vocab)
    assert result.parity_rel <= scheme_named("int8").gate
    assert "MatMulInteger" in {n.op_type for n in onnx.load(str(result.path)).graph.node}


def test_gpt2s_biased_products_become_matmuls_the_4_bit_quantizer_takes(tiny_gpt2_dir, tmp_path):
    """GPT-2's Conv1D layers are Gemm(x, W, C) in fp32, which MatMulNBits' quantizer passes by: int4 left them
    fp32. Rewritten MatMul(x, W) + C, the graph computes what it did, and int4 rounds every one of them."""
    import onnxruntime as ort

    from converters.export import sample_inputs
    from converters.quantization.rounding.products import products_as_matmul
    from eval.probe import full_feed

    model, _ = load_model(tiny_gpt2_dir)
    fp32 = export_onnx(model, tmp_path / "lm.onnx").path
    proto = onnx.load(str(fp32))
    gemms = [n for n in proto.graph.node if n.op_type == "Gemm" and len(n.input) == 3]
    assert len(gemms) == 4 * model.config.n_layer  # attention in and out, the MLP's two
    rewritten = products_as_matmul(onnx.load(str(fp32)))
    assert "Gemm" not in {n.op_type for n in rewritten.graph.node}
    vocab = model.get_input_embeddings().num_embeddings
    ids, mask = sample_inputs(vocab, 2, 5, 0)
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    sessions = [ort.InferenceSession(p.SerializeToString()) for p in (proto, rewritten)]
    before, after = (s.run(["logits"], full_feed(s, feed))[0] for s in sessions)
    np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4 * np.abs(before).max())
    result = quantize_onnx(fp32, tmp_path / "lm-int4.onnx", scheme_named("int4")(), vocab=vocab)
    ops = [n.op_type for n in onnx.load(str(result.path)).graph.node]
    assert ops.count("MatMulNBits") == len(gemms) + 1 and "Gemm" not in ops  # the layers and the tied head


def test_the_gate_judges_on_text_when_the_caller_has_it(tiny_bert_dir, tmp_path):
    # random ids make activations no text makes: the gate reads the text's real tokens, padding left out
    from eval.graph import make_session
    from texts.tokens import encode_passages, load_tokenizer

    model, _ = load_model(tiny_bert_dir)
    fp32 = export_onnx(model, tmp_path / "m.onnx").path
    vocab = model.get_input_embeddings().num_embeddings
    passages = ["the cat sat on the mat", "a b c", "one two three four five six seven"] * 4
    text = encode_passages(load_tokenizer(tiny_bert_dir), passages)
    result = quantize_onnx(fp32, tmp_path / "t.onnx", scheme_named("int8")(), text, vocab=vocab)
    assert result.parity_input == f"{len(passages)} passages of text"
    ys = [make_session(p).run(None, feed)[0] for p in (fp32, result.path) for feed in text[:1]]
    mask = text[0]["attention_mask"].astype(bool)
    diff = ys[1][mask] - ys[0][mask]
    assert result.parity_rel == pytest.approx(np.linalg.norm(diff) / np.linalg.norm(ys[0][mask]), rel=1e-3)
    assert quantize_onnx(fp32, tmp_path / "r.onnx", scheme_named("int8")(), vocab=vocab).parity_input == "random ids"
