"""Projections multiplied side by side (converters/quantization/corrections/fused_student.py): int4-trained on the fused
decoder's graph, whose q, k and v are one MatMul, holds them as one corrected layer the three read slices of, and
its student computes what the graph computes."""

import numpy as np
import pytest
import torch

from compressor.corrected_linear import CorrectedLinear
from converters.checkpoint import load_model
from converters.export import export_onnx, sample_inputs
from converters.finetune import Distillation, finetune_
from converters.finetune.config import FinetuneConfig
from converters.quantization.corrections.fused_student import SIDE_BY_SIDE, Slice
from converters.quantization.corrections.training import trainer
from converters.quantization.quantize import quantize_onnx
from converters.quantization.registry import scheme_named
from eval.graph import make_session
from eval.probe import full_feed
from tests.conftest import write_tiny_lm
from tests.converters.test_tied_codes import PASSAGES
from texts.tokens import encode_passages, load_tokenizer


@pytest.fixture(scope="module")
def fused_llama(tmp_path_factory):
    """A tiny tied Llama whose heads (32 dimensions) the fused decoder takes, and its fp32 graph."""
    path = write_tiny_lm(tmp_path_factory.mktemp("fused") / "llama", "llama", hidden=128)
    model, _ = load_model(path)
    return path, model, export_onnx(model, path.parent / "lm.onnx").path


def test_int4_trained_holds_the_fused_projections_as_one_corrected_layer(fused_llama, tmp_path):
    path, model, fp32 = fused_llama
    vocab = model.get_input_embeddings().num_embeddings
    ids = sample_inputs(vocab, 1, 9, 0)[0]
    mask = torch.ones_like(ids)
    seen = {}

    def fit(student):  # no steps: the student as the graph's rounding and closed-form corrections make it
        with torch.no_grad():
            seen["logits"] = student(input_ids=ids, attention_mask=mask).logits.numpy()
        seen["student"] = student

    text = encode_passages(load_tokenizer(path), PASSAGES)
    config = scheme_named("int4-trained")(block_size=16, accuracy_level=0, correction_share=0.3)
    result = quantize_onnx(fp32, tmp_path / "t.onnx", config, text, vocab=vocab, train=trainer(model, fit))
    fused = [out for out in result.corrections if "qkv_proj" in out]
    assert fused and "logits" in result.corrections  # q, k and v corrected as one product, and the tied head
    attention = seen["student"].model.layers[0].self_attn
    slices = [getattr(attention, part) for part in SIDE_BY_SIDE]
    assert all(isinstance(s, Slice) for s in slices) and len({id(s.fused) for s in slices}) == 1
    assert isinstance(slices[0].fused.layer, CorrectedLinear) and slices[0].fused.layer.rank > 0
    session = make_session(result.path)
    graph = session.run(["logits"], full_feed(session, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}))[0]
    with torch.no_grad():
        dense = model(input_ids=ids, attention_mask=mask).logits.numpy()
    scale = np.abs(graph).max()
    assert np.abs(seen["logits"] - graph).max() <= 1e-2 * scale  # the graph's factors rounded to 8 bits after
    assert np.abs(dense - graph).max() >= 5 * np.abs(seen["logits"] - graph).max()  # not the unrounded model's


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine")
def test_int4_trained_trains_an_lm_on_a_gpu_and_its_graph_computes_the_trained_student(fused_llama, tmp_path):
    """Item 4's GPU path on an LM: the fused projections' shared layer and the tied head's hooked corrections train
    on cuda, the student comes back to the CPU, and the graph written from it computes what it computes."""
    path, model, fp32 = fused_llama
    vocab = model.get_input_embeddings().num_embeddings
    tokenizer = load_tokenizer(path)
    cfg = FinetuneConfig(steps=20, seconds=None, linear_lr=1e-3, eval_every=10, batch_size=4, device="cuda")
    reports, students = [], []

    def fit(student):
        reports.append(
            finetune_(Distillation(student, model, tokenizer, PASSAGES[:9], PASSAGES[9:], (CorrectedLinear,)), cfg)
        )
        students.append(student)

    text = encode_passages(tokenizer, PASSAGES)
    config = scheme_named("int4-trained")(block_size=16, accuracy_level=0, correction_share=0.3)
    result = quantize_onnx(fp32, tmp_path / "t.onnx", config, text, vocab=vocab, train=trainer(model, fit))
    (report,), (student,) = reports, students
    assert report.device.startswith("cuda") and report.steps == 20 and next(student.parameters()).device.type == "cpu"
    ids = sample_inputs(vocab, 1, 9, 0)[0]
    mask = torch.ones_like(ids)
    session = make_session(result.path)
    graph = session.run(["logits"], full_feed(session, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}))[0]
    with torch.no_grad():
        trained = student(input_ids=ids, attention_mask=mask).logits.numpy()
    assert np.abs(trained - graph).max() <= 1e-2 * np.abs(graph).max()
