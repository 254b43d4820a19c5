"""Causal language models on tiny Llama and GPT-2 models made in the test: the kind, the tied head
through the compressed table's factors, checkpoints and ONNX holding the table once, KL distillation."""

import inspect
import json

import numpy as np
import onnx
import pytest
import torch
from safetensors import safe_open
from transformers.pytorch_utils import Conv1D

from compressor.errors import CompressorError, PlanError
from compressor.head_tail import HeadTailEmbedding
from compressor.lowrank_embedding import LowRankEmbedding
from compressor.lowrank_linear import LowRankLinear
from compressor.tied_logits import TiedLogits
from compressor.tt_embedding import TTEmbedding
from converters.checkpoint import CHECKPOINT_WEIGHTS, load_model, save_compressed
from converters.compress import compress_
from converters.export import export_onnx
from converters.finetune import Distillation, FinetuneRun, finetune_
from converters.finetune.config import FinetuneConfig
from converters.kinds import kind_of
from converters.kinds.causal_lm import CAUSAL_LM, CausalLMGraph
from converters.methods.lowrank import LowRankConfig
from converters.plan import Plan, match_plan
from converters.registry import compact_modules
from converters.submodules import set_submodule
from tests.conftest import write_tiny_lm
from texts.tokens import load_tokenizer

TEXTS = [f"the {w} value of a list is a string in python module {i}" for i, w in enumerate("abcdefgh" * 4)]


@pytest.fixture(params=["llama", "gpt2"])
def lm_dir(request, tiny_llama_dir, tiny_gpt2_dir):
    return {"llama": tiny_llama_dir, "gpt2": tiny_gpt2_dir}[request.param]


def logits(model, ids):
    with torch.no_grad():
        return CAUSAL_LM.output(model, ids, torch.ones_like(ids))


def ids_of(model, batch=2, seq=9, seed=0):
    vocab = model.get_input_embeddings().num_embeddings
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


def test_a_tied_lm_is_the_causal_kind_and_its_head_reads_the_input_table(lm_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(lm_dir).eval()
    model, _ = load_model(lm_dir)
    assert kind_of(model) is CAUSAL_LM
    head = model.get_output_embeddings()
    assert isinstance(head, TiedLogits) and head.embedding is model.get_input_embeddings()
    assert not any("lm_head" in k for k in model.state_dict())  # the table once
    ids = ids_of(model)
    torch.testing.assert_close(logits(model, ids), logits(hf, ids), rtol=1e-4, atol=1e-5)


def _head_tail(table):
    return HeadTailEmbedding.from_embedding(table, [0, 5, 9], lambda w, ids: LowRankEmbedding.from_weight(w, 48))


FULL_RANK_TABLES = {
    "lowrank": lambda table: LowRankEmbedding.from_weight(table.weight, 48),
    "head-tail": _head_tail,
    "tt": lambda table: TTEmbedding.from_weight(table.weight, rank=64, order="pca"),
}


@pytest.mark.parametrize("make", FULL_RANK_TABLES.values(), ids=FULL_RANK_TABLES.keys())
def test_at_full_rank_the_compressed_tied_lm_equals_the_dense_one(lm_dir, make):
    model, _ = load_model(lm_dir)
    dense, _ = load_model(lm_dir)
    table = make(model.get_input_embeddings())
    model.set_input_embeddings(table)
    CAUSAL_LM.tie_(model)
    head = model.get_output_embeddings()
    assert isinstance(head, TiedLogits) and head.embedding is table
    h = torch.randn(3, 48)
    torch.testing.assert_close(head(h), h @ table.to_dense().T, rtol=1e-4, atol=1e-5)  # the logits through the factors
    ids = ids_of(model)
    torch.testing.assert_close(logits(model, ids), logits(dense, ids), rtol=1e-4, atol=1e-4)


def test_the_compressed_table_is_stored_once_in_the_checkpoint_and_the_onnx_graph(lm_dir, tmp_path):
    model, source = load_model(lm_dir)
    plan = Plan((("embeddings", LowRankConfig(fit="plain", rank=6, keep=None)),))
    report = compress_(model, plan, progress=False)
    save_compressed(model, plan, report, source, tmp_path / "ckpt")
    with safe_open(str(tmp_path / "ckpt" / CHECKPOINT_WEIGHTS), framework="pt") as f:
        keys = list(f.keys())
    assert sum(k.endswith("codes") for k in keys) == 1 and not any(k.startswith("lm_head") for k in keys)
    loaded, _ = load_model(tmp_path / "ckpt")
    assert isinstance(loaded.get_input_embeddings(), LowRankEmbedding)
    assert loaded.get_output_embeddings().embedding is loaded.get_input_embeddings()
    ids = ids_of(model)
    torch.testing.assert_close(logits(loaded, ids), logits(model, ids), rtol=1e-4, atol=1e-5)

    result = export_onnx(loaded, tmp_path / "lm.onnx")
    assert result.parity_max_abs <= 1e-4
    graph = onnx.load(str(result.path)).graph
    vocab = model.get_input_embeddings().num_embeddings
    assert [o.name for o in graph.output][0] == "logits"
    with_vocab = [tuple(i.dims) for i in graph.initializer if vocab in i.dims]
    assert with_vocab == [(vocab, 6)]  # the codes, once: no transposed copy for the head


def test_the_original_tied_lm_exports_its_table_once(lm_dir, tmp_path):
    model, _ = load_model(lm_dir)
    graph = onnx.load(str(export_onnx(model, tmp_path / "lm.onnx").path)).graph
    vocab, dim = model.get_input_embeddings().weight.shape
    assert [tuple(i.dims) for i in graph.initializer if vocab in i.dims] == [(vocab, dim)]


def test_low_rank_takes_gpt2_conv1d_layers_exactly_at_full_rank(tiny_gpt2_dir):
    model, _ = load_model(tiny_gpt2_dir)
    dense, _ = load_model(tiny_gpt2_dir)
    report = compress_(model, Plan((("linear", LowRankConfig(fit="plain", rank=4, keep=None)),)), progress=False)
    assert {n.split(".")[-1] for n in report.modules} == {"c_attn", "c_proj", "c_fc"}
    for name, module in list(dense.named_modules()):
        if isinstance(module, Conv1D):  # full rank (which saves nothing, so a plan would skip it): exact
            set_submodule(dense, name, LowRankLinear.from_linear(module, min(module.weight.shape)))
    fresh, _ = load_model(tiny_gpt2_dir)
    ids = ids_of(model)
    torch.testing.assert_close(logits(dense, ids), logits(fresh, ids), rtol=1e-4, atol=1e-4)


def test_target_keywords_mean_the_same_parts_of_a_llama_block(tiny_llama_dir):
    model, _ = load_model(tiny_llama_dir)
    cfg = LowRankConfig(fit="plain", rank=2, keep=None)
    ends = {
        target: {n.split(".")[-1] for n in match_plan(Plan(((target, cfg),)), model)}
        for target in ("attention", "ffn", "embeddings")
    }
    assert ends == {
        "attention": {"q_proj", "k_proj", "v_proj", "o_proj"},
        "ffn": {"gate_proj", "up_proj", "down_proj"},
        "embeddings": {"embed_tokens"},
    }


def test_the_head_target(tmp_path, tiny_llama_dir, tiny_bert_dir):
    cfg = LowRankConfig(fit="plain", rank=2, keep=None)
    tied, _ = load_model(tiny_llama_dir)
    with pytest.raises(PlanError, match="tied to the input embedding"):
        match_plan(Plan((("head", cfg),)), tied)
    encoder, _ = load_model(tiny_bert_dir)
    with pytest.raises(PlanError, match="needs an output projection"):
        match_plan(Plan((("head", cfg),)), encoder)
    untied, _ = load_model(write_tiny_lm(tmp_path / "untied", "llama", tied=False))
    assert list(match_plan(Plan((("head", cfg),)), untied)) == ["lm_head"]
    compress_(untied, Plan((("head", cfg),)), progress=False)
    assert not isinstance(untied.get_output_embeddings(), TiedLogits)


def test_kl_distillation_lowers_the_kl_to_the_teacher(tiny_llama_dir):
    teacher, source = load_model(tiny_llama_dir)
    student, _ = load_model(tiny_llama_dir)
    compress_(student, Plan((("embeddings", LowRankConfig(fit="plain", rank=3, keep=None)),)), progress=False)
    cfg = FinetuneConfig(steps=25, seconds=None, lr=1e-2, eval_every=5, layer_weight=0.0)
    compact = tuple(compact_modules().values())
    report = finetune_(
        Distillation(student, teacher, load_tokenizer(source), TEXTS, TEXTS[:8], compact),
        cfg,
        FinetuneRun(progress=False),
    )
    assert report.steps == 25
    assert report.best_val_cosine > report.start_val_cosine  # −KL rose
    assert report.start_val_cosine < 0


def test_kl_loss_and_agreement():
    teacher = torch.randn(2, 4, 7)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    cfg = FinetuneConfig(temperature=2.0)
    assert float(CAUSAL_LM.distill_loss(teacher, teacher, mask, cfg)) == pytest.approx(0.0, abs=1e-6)
    student = teacher + torch.randn(2, 4, 7)
    p, q = torch.log_softmax(teacher, -1), torch.log_softmax(student, -1)
    kl = (p.exp() * (p - q)).sum(-1)  # (B, T)
    expected = -(kl * mask).sum(1) / mask.sum(1)
    torch.testing.assert_close(CAUSAL_LM.agreement(student, teacher, mask), expected, rtol=1e-4, atol=1e-5)
    assert float(CAUSAL_LM.distill_loss(student, teacher, mask, cfg)) > 0


def test_the_distillation_kl_a_chunk_of_positions_at_a_time_has_the_whole_ones_value_and_gradient():
    """More positions than KL_ROWS: the chunks, their intermediates made again in the backward, give the loss and
    the student's gradient of the KL made whole."""
    from converters.kinds import causal_lm

    torch.manual_seed(0)
    student = torch.randn(3, causal_lm.KL_ROWS, 11, requires_grad=True)
    teacher, mask = torch.randn(3, causal_lm.KL_ROWS, 11), torch.ones(3, causal_lm.KL_ROWS, dtype=torch.long)
    mask[1, 5:] = 0
    cfg = FinetuneConfig(temperature=2.0)
    (grad,) = torch.autograd.grad(CAUSAL_LM.distill_loss(student, teacher, mask, cfg), student)
    p, q = torch.log_softmax(teacher / 2, -1), torch.log_softmax(student / 2, -1)
    whole = 4 * ((p.exp() * (p - q)).sum(-1) * mask).sum() / mask.sum()
    (expected,) = torch.autograd.grad(whole, student)
    torch.testing.assert_close(CAUSAL_LM.distill_loss(student, teacher, mask, cfg), whole, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-7)


def test_fisher_probes_give_the_output_fisher():
    """E[g gᵀ] of ∇_z log p(y|z), y ~ p, is diag(p) − p pᵀ: the Hessian of KL at the output."""
    z = torch.tensor([[[0.3, -1.0, 2.0, 0.1]]], requires_grad=True)
    mask = torch.ones(1, 1, dtype=torch.long)
    generator = torch.Generator().manual_seed(0)
    grads = []
    for probe in CAUSAL_LM.probes(z, mask, 4000, generator):
        (g,) = torch.autograd.grad(probe, z, retain_graph=True)
        grads.append(g.view(-1))
    g = torch.stack(grads)
    p = torch.softmax(z.detach().view(-1), 0)
    np.testing.assert_allclose((g.T @ g / len(g)).numpy(), (torch.diag(p) - torch.outer(p, p)).numpy(), atol=0.02)


def test_a_fisher_plan_calibrates_and_compresses_a_tiny_lm(tiny_gpt2_dir):
    from converters.calibration import calibrate

    model, source = load_model(tiny_gpt2_dir)
    names = sorted(match_plan(Plan((("linear", LowRankConfig()),)), model))
    calib = calibrate(model, load_tokenizer(source), TEXTS, names, sensitivity=True, progress=False)
    assert set(calib.sensitivities) == {*names, "transformer.wte"}
    plan = Plan((("embeddings", LowRankConfig(rank=4, dense_head=6, fit="fisher")),))
    compress_(model, plan, calib, progress=False)
    assert isinstance(model.get_input_embeddings(), HeadTailEmbedding)
    assert model.get_output_embeddings().embedding is model.get_input_embeddings()


@pytest.mark.parametrize(
    "config, kind",
    [
        ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, "causal-lm"),
        ({"architectures": ["BertForMaskedLM"], "model_type": "bert"}, "encoder"),
        ({"architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta"}, "encoder"),
        ({"model_type": "llama"}, "causal-lm"),  # no architectures: the type decides
        ({"model_type": "qwen2"}, "causal-lm"),
        ({"model_type": "gpt2"}, "causal-lm"),
        ({"model_type": "bert"}, "encoder"),  # a BertLMHeadModel exists too, but so does a masked LM
        ({"model_type": "mpnet"}, "encoder"),
    ],
)
def test_the_kind_from_a_config_with_and_without_architectures(tmp_path, config, kind):
    from converters.kinds import kind_for_config

    (tmp_path / "config.json").write_text(json.dumps(config))
    assert kind_for_config(tmp_path).name == kind


@pytest.mark.parametrize(
    "config",
    [
        {"architectures": ["BartForConditionalGeneration"], "model_type": "bart", "is_encoder_decoder": True},
        {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5"},
        {"architectures": ["ViTModel"], "model_type": "vit"},
        {},
    ],
)
def test_a_model_no_kind_takes_is_named_with_the_kinds_there_are(tmp_path, config):
    from converters.kinds import kind_for_config

    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CompressorError, match="no kind takes: the kinds are causal-lm .* and encoder"):
        kind_for_config(tmp_path)


class _PastKeyValues(torch.nn.Module):
    """`model` as transformers before 5.2x calls it: its cache passed as past_key_values."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.config = model, model.config
        takes = inspect.signature(model.forward).parameters
        self.name = "cache" if "cache" in takes else "past_key_values"  # the installed transformers' name

    def forward(self, input_ids, attention_mask, position_ids, past_key_values=None, use_cache=False):
        cache = {self.name: past_key_values}
        return self.inner(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache, **cache
        )


def test_the_cached_graph_passes_its_cache_by_the_name_the_model_takes(lm_dir):
    """A prompt, then one more token fed the prompt's presents: the same logits and presents whether the model
    takes its cache as `cache` (transformers now) or as past_key_values (before 5.2x), where `cache` would be
    swallowed and the pasts ignored."""
    model, _ = load_model(lm_dir)
    model.eval()
    graphs = [CausalLMGraph(model), CausalLMGraph(_PastKeyValues(model))]
    assert graphs[1].cache_name == "past_key_values"
    ids = ids_of(model, batch=1, seq=6)
    empty = torch.zeros(1, graphs[0].heads, 0, graphs[0].head_dim)
    results = []
    with torch.no_grad():
        for graph in graphs:
            prompt = graph(
                ids[:, :5], torch.ones(1, 5, dtype=torch.long), torch.arange(5)[None], *[empty] * (2 * graph.layers)
            )
            step = graph(ids[:, 5:], torch.ones(1, 6, dtype=torch.long), torch.tensor([[5]]), *prompt[1:])
            results.append(step)
    assert all(t.shape[2] == 6 for t in results[1][1:])  # the pasts were taken: 5 + 1 positions
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
