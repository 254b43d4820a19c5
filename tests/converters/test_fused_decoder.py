"""The fused decoder's graph (converters.kinds.fused_decoder): written for a plain Llama-style model whose
heads GroupQueryAttention takes, with the table stored once under a tied head (at the IR version its opsets
need: ONNX Runtime 1.30 refuses onnx 1.23's newest, 14); not for a model with a
compressed layer or heads of another size (they are traced); int8 and int4 round its MatMuls and keep
its fused operators. Its logits against PyTorch at every cached step: tests/eval/test_decode.py."""

import collections

import numpy as np
import onnx
import pytest

from converters.checkpoint import load_model
from converters.compress import compress_
from converters.export import export_onnx
from converters.kinds.fused_decoder import fused_decoder, unfused_reason
from converters.methods.lowrank import LowRankConfig
from converters.plan import Plan
from converters.quantization.quantize import quantize_onnx
from converters.quantization.registry import scheme_named
from eval.graph import make_session
from eval.probe import full_feed
from tests.conftest import GEMMA_WINDOW, write_tiny_lm


@pytest.fixture(scope="module")
def fused_dir(tmp_path_factory):
    return write_tiny_lm(tmp_path_factory.mktemp("fused") / "llama", "llama", hidden=64)


def _ops(path) -> collections.Counter:
    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


def test_a_plain_llama_is_written_fused_with_its_table_once(fused_dir, tmp_path):
    model, _ = load_model(fused_dir)
    result = export_onnx(model, tmp_path / "fused.onnx")
    ops = _ops(result.path)
    layers = model.config.num_hidden_layers
    assert ops["GroupQueryAttention"] == layers and ops["SkipSimplifiedLayerNormalization"] == 2 * layers
    assert ops["MatMul"] == 5 * layers  # q, k and v as one
    graph = onnx.load(str(result.path)).graph
    assert "position_ids" not in {i.name for i in graph.input}
    table = model.get_input_embeddings().weight
    stored = [i for i in graph.initializer if tuple(i.dims) in (tuple(table.shape), tuple(table.shape[::-1]))]
    assert len(stored) == 1  # the Gather's table is the FusedMatMul's, not a transposed copy
    assert result.parity_max_abs <= 1e-4
    written = onnx.load(str(result.path), load_external_data=False)  # the IR its opsets need, not this onnx's newest:
    assert written.ir_version == onnx.helper.find_min_ir_version_for(written.opset_import, ignore_unknown=True) == 10


def test_other_models_are_traced(fused_dir, tiny_llama_dir):
    narrow, _ = load_model(tiny_llama_dir)  # heads of 12 dimensions: GroupQueryAttention takes multiples of 16
    assert fused_decoder(narrow) is None
    model, _ = load_model(fused_dir)
    assert fused_decoder(model) is not None
    for setting, value in (("partial_rotary_factor", 0.5), ("sliding_window", 32)):  # another attention
        before = getattr(model.config, setting, None)
        setattr(model.config, setting, value)
        assert fused_decoder(model) is None, setting
        setattr(model.config, setting, before)
    compress_(model, Plan((("ffn", LowRankConfig(rank=4, fit="plain")),)), progress=False)
    assert fused_decoder(model) is None


@pytest.mark.parametrize("scheme, rounded", [("int8", "MatMulInteger"), ("int4", "MatMulNBits")])
def test_quantization_rounds_the_matmuls_and_keeps_the_fused_operators(fused_dir, tmp_path, scheme, rounded):
    model, _ = load_model(fused_dir)
    fp32 = export_onnx(model, tmp_path / "fp32.onnx").path
    vocab = model.config.vocab_size
    result = quantize_onnx(fp32, tmp_path / f"{scheme}.onnx", scheme_named(scheme)(), vocab=vocab)
    ops = _ops(result.path)
    assert ops["GroupQueryAttention"] == model.config.num_hidden_layers and ops[rounded] > 0
    feed = {"input_ids": np.array([[3, 7, 11, 5]]), "attention_mask": np.ones((1, 4), np.int64)}
    logits = [make_session(p).run(["logits"], full_feed(make_session(p), feed))[0] for p in (fp32, result.path)]
    assert np.linalg.norm(logits[1] - logits[0]) / np.linalg.norm(logits[0]) < 0.2


def test_the_int4_graph_computes_its_rounded_twin(fused_dir, tmp_path):
    # at MatMulNBits' fp32 compute the int4 graph is the model holding the weights it multiplies by
    import torch

    from converters.export import sample_inputs
    from converters.kinds.fused_decoder import rounded_twin

    model, _ = load_model(fused_dir)
    vocab = model.get_input_embeddings().num_embeddings
    fp32 = export_onnx(model, tmp_path / "lm.onnx").path
    graph_path = quantize_onnx(
        fp32, tmp_path / "q4.onnx", scheme_named("int4")(block_size=16, accuracy_level=0), vocab=vocab
    ).path
    twin = rounded_twin(load_model(fused_dir)[0], onnx.load(str(graph_path)).graph).eval()
    ids, mask = sample_inputs(vocab, 2, 7, 0)
    session = make_session(graph_path)
    ours = session.run(["logits"], full_feed(session, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}))[0]
    with torch.no_grad():
        theirs, original = (m(input_ids=ids, attention_mask=mask).logits.numpy() for m in (twin, model))
    scale = np.abs(original).max()
    assert np.abs(ours - theirs).max() < 1e-4 * scale  # the same weights, fp32 summation order apart
    assert np.abs(ours - original).max() > 1e-2 * scale  # and not the original's: 4 bits were rounded
    with pytest.raises(ValueError, match="smoothed or corrected"):
        aware = quantize_onnx(
            fp32, tmp_path / "a.onnx", scheme_named("int4-aware")(block_size=16), _feeds(vocab), vocab=vocab
        ).path
        rounded_twin(model, onnx.load(str(aware)).graph)


def _feeds(vocab: int) -> list[dict]:
    from converters.export import sample_inputs

    names = ("input_ids", "attention_mask")
    return [dict(zip(names, (x.numpy() for x in sample_inputs(vocab, 4, 12, seed)))) for seed in range(4)]


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    return write_tiny_lm(tmp_path_factory.mktemp("fused") / "gemma3", "gemma3", hidden=64)


def test_a_gemma3_is_written_fused_with_its_windows_and_head_norms(gemma_dir, tmp_path):
    model, _ = load_model(gemma_dir)
    result = export_onnx(model, tmp_path / "gemma.onnx")
    graph = onnx.load(str(result.path)).graph
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    windows = [next(a.i for a in n.attribute if a.name == "local_window_size") for n in attention]
    assert windows == [GEMMA_WINDOW, -1, GEMMA_WINDOW]  # the local layers' window, the global layer's whole past
    ops = collections.Counter(n.op_type for n in graph.node)
    layers = model.config.num_hidden_layers
    assert ops["FastGelu"] == layers  # q, k, after the attention and the MLP, and the first layer's input:
    assert ops["SimplifiedLayerNormalization"] == 4 * layers + 1
    assert result.parity_max_abs <= 1e-4


def test_the_fused_gemma3_reads_past_its_window_as_transformers_does(gemma_dir, tmp_path):
    import torch

    model, _ = load_model(gemma_dir)
    session = make_session(export_onnx(model, tmp_path / "gemma.onnx").path)
    ids = torch.arange(3, 3 + 4 * GEMMA_WINDOW).unsqueeze(0)  # four windows long
    feed = {"input_ids": ids.numpy(), "attention_mask": np.ones(ids.shape, np.int64)}
    ours = session.run(["logits"], full_feed(session, feed))[0]
    with torch.no_grad():
        theirs = model(input_ids=ids).logits.numpy()
        model.config.layer_types = ["full_attention"] * model.config.num_hidden_layers
        unwindowed = model(input_ids=ids).logits.numpy()
    scale = np.abs(theirs).max()
    assert np.abs(ours - theirs).max() < 1e-4 * scale
    assert np.abs(ours - unwindowed).max() > 1e-2 * scale  # the window is no detail these logits would hide


def test_a_model_outside_the_form_is_said_why(fused_dir):
    model, _ = load_model(fused_dir)
    assert unfused_reason(model) is None
    model.config.hidden_act = "relu"
    assert "relu" in unfused_reason(model) and fused_decoder(model) is None
    model.config.hidden_act = "silu"
    model.config.final_logit_softcapping = 30.0
    assert "final_logit_softcapping" in unfused_reason(model)
