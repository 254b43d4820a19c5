import dataclasses

import pytest
import torch

from compressor.errors import CompressorError, PlanError
from compressor.head_tail import HeadTailEmbedding
from compressor.lowrank_linear import LowRankLinear
from converters.budget import parse_budget, plan_for_budget
from converters.calibration import Calibration, cached_calibration, calibrate, statistics_bytes, token_counts
from converters.checkpoint import load_model, save_compressed
from converters.compress import compress_
from converters.export import export_onnx
from converters.kinds.encoder import ENCODER
from converters.methods.lowrank import LowRankConfig
from converters.methods.tt import TTConfig
from converters.plan import Plan
from texts.tokens import load_tokenizer

TEXTS = [f"the value {i} of list and dict is a string in python module" * (1 + i % 3) for i in range(24)]
LINEAR = ["encoder.layer.0.attention.self.query", "encoder.layer.1.output.dense"]
ALL_LINEAR = [
    f"encoder.layer.{i}.{part}"
    for i in range(2)
    for part in (
        "attention.self.query",
        "attention.self.key",
        "attention.self.value",
        "attention.output.dense",
        "intermediate.dense",
        "output.dense",
    )
]


@pytest.fixture(scope="module")
def tiny(tiny_bert_dir):
    model, source = load_model(tiny_bert_dir)
    return model, source, load_tokenizer(source)


@pytest.fixture(scope="module")
def calib(tiny):
    model, _, tok = tiny
    return calibrate(model, tok, TEXTS, ALL_LINEAR, batch=5, progress=False, sensitivity=True)


def test_streamed_gram_equals_the_gram_of_all_inputs(tiny, calib):
    model, _, tok = tiny
    seen = []
    handle = model.get_submodule(LINEAR[1]).register_forward_hook(lambda m, i, o: seen.append(i[0]))
    enc = tok(TEXTS, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():
        model(**{k: enc[k] for k in ("input_ids", "attention_mask")})
    handle.remove()
    x = seen[0][enc["attention_mask"].bool()].double()  # real tokens only
    assert torch.allclose(calib.grams[LINEAR[1]], x.T @ x, rtol=1e-9, atol=1e-6)
    assert calib.tokens == int(enc["attention_mask"].sum())
    assert int(calib.counts[tok.cls_token_id]) == len(TEXTS)


@pytest.mark.parametrize("sensitivity", [False, True])
def test_cache_returns_the_same_statistics(tiny, tmp_path, sensitivity):
    model, _, tok = tiny
    first = cached_calibration(tmp_path, model, tok, TEXTS, LINEAR, progress=False, sensitivity=sensitivity)
    assert len(list(tmp_path.glob("calibration-*.safetensors"))) == 1
    again = cached_calibration(tmp_path, model, tok, TEXTS, LINEAR, progress=False)  # reuses either
    assert len(list(tmp_path.glob("calibration-*.safetensors"))) == 1
    assert torch.equal(first.counts, again.counts) and first.special_ids == again.special_ids
    assert all(torch.equal(first.grams[n], again.grams[n]) for n in LINEAR)
    assert first.sensitivities.keys() == again.sensitivities.keys()
    assert all(torch.equal(first.sensitivities[n], again.sensitivities[n]) for n in first.sensitivities)


def test_cache_key_follows_the_weights_and_a_damaged_file_is_a_miss(tiny, tmp_path, capsys):
    model, _, tok = tiny
    first = cached_calibration(tmp_path, model, tok, TEXTS, LINEAR, progress=False)
    (path,) = tmp_path.glob("calibration-*.safetensors")
    path.write_bytes(path.read_bytes()[:100])  # cut short, as by a crash
    again = cached_calibration(tmp_path, model, tok, TEXTS, LINEAR, progress=False)
    assert "damaged" in capsys.readouterr().err
    assert torch.equal(first.grams[LINEAR[0]], again.grams[LINEAR[0]])
    assert [p.stat().st_size for p in tmp_path.glob("calibration-*")] > [100]  # written whole again
    with torch.no_grad():
        model.get_submodule(LINEAR[0]).weight.mul_(2.0)  # fine-tuned in place: other weights, another key
    try:
        cached_calibration(tmp_path, model, tok, TEXTS, LINEAR, progress=False)
    finally:
        with torch.no_grad():
            model.get_submodule(LINEAR[0]).weight.div_(2.0)
    assert len(list(tmp_path.glob("calibration-*.safetensors"))) == 2


def test_layers_fed_one_input_share_one_gram_and_the_cache_keeps_it_so(tiny, calib, tmp_path):
    query, key, value, dense = (
        f"encoder.layer.0.attention.{p}" for p in ("self.query", "self.key", "self.value", "output.dense")
    )
    assert calib.grams[key] is calib.grams[query] and calib.grams[value] is calib.grams[query]
    assert calib.grams[dense] is not calib.grams[query]  # another input: its own statistics
    model, _, tok = tiny
    first = cached_calibration(tmp_path, model, tok, TEXTS, ALL_LINEAR, progress=False)
    again = cached_calibration(tmp_path, model, tok, TEXTS, ALL_LINEAR, progress=False)
    assert again.grams[value] is again.grams[query]
    assert all(torch.equal(first.grams[n], again.grams[n]) for n in ALL_LINEAR)
    # the batch size changes how the sum's float32 terms are grouped, not what they are
    assert torch.allclose(again.grams[value], calib.grams[query], rtol=1e-6, atol=0)


def test_the_time_is_said_after_the_first_batch_and_the_memory_before_any(tiny):
    model, _, tok = tiny
    said = []
    calibrate(model, tok, TEXTS, LINEAR, batch=5, progress=False, on_estimate=said.append)
    assert len(said) == 1 and said[0] > 0
    widths = [model.get_submodule(n).weight.shape for n in LINEAR]
    assert statistics_bytes(model, LINEAR, False) == 8 * sum(w[1] ** 2 for w in widths)
    table = model.get_input_embeddings().embedding_dim ** 2
    assert statistics_bytes(model, LINEAR, True) == 8 * (sum(w[1] ** 2 + w[0] ** 2 for w in widths) + table)


def test_without_a_cache_nothing_is_written(tiny, tmp_path):
    model, _, tok = tiny
    calib = cached_calibration(None, model, tok, TEXTS, LINEAR, progress=False)
    assert calib.tokens > 0 and list(tmp_path.iterdir()) == []


def test_probes_have_the_hessian_of_the_cosine_loss_as_covariance():
    """E[z zᵀ] = (I − êêᵀ) / ‖e‖², z = ∂(zᵀe)/∂e: the Hessian of 1 − cos(e, ·) at e."""
    e = torch.tensor([[3.0, 0.0, 4.0, 0.0]], dtype=torch.float64)
    hidden = e[:, None, :].clone().requires_grad_(True)  # one passage, one token
    probes = ENCODER.probes(hidden, torch.ones(1, 1), 20_000, torch.Generator().manual_seed(0))
    z = torch.stack([torch.autograd.grad(p, hidden, retain_graph=True)[0][0, 0] for p in probes])
    unit = e[0] / e.norm()
    expected = (torch.eye(4, dtype=torch.float64) - torch.outer(unit, unit)) / 25.0
    assert torch.allclose(z.T @ z / len(probes), expected, atol=2e-3)


def test_sensitivities_cover_the_layers_and_the_embedding(tiny, calib, tiny_bert_dir):
    model, _, _ = tiny
    assert set(calib.sensitivities) == {*ALL_LINEAR, "embeddings.word_embeddings"}
    for name, f in calib.sensitivities.items():
        out = model.get_submodule(name).weight.shape[0 if name in ALL_LINEAR else 1]
        assert f.shape == (out, out) and torch.allclose(f, f.T, atol=1e-6)
        assert float(torch.linalg.eigvalsh(f).min()) >= -1e-9 * float(f.diagonal().max())
    fresh, _ = load_model(tiny_bert_dir)
    assert [p.requires_grad for p in model.parameters()] == [p.requires_grad for p in fresh.parameters()]


def test_too_little_calibration_text_raises(tiny):
    model, _, tok = tiny
    with pytest.raises(CompressorError, match="at least 64 are needed"):
        calibrate(model, tok, ["the"], LINEAR, progress=False)


def test_a_rank_above_the_calibration_tokens_says_how_many_are_needed(tiny_bert_dir, calib):
    model, _ = load_model(tiny_bert_dir)
    few = Calibration(calib.grams, torch.zeros_like(calib.counts).index_fill_(0, torch.tensor([5]), 20))
    with pytest.raises(PlanError, match="has 20 tokens; activation-aware rank 24 needs at least 24"):
        compress_(model, Plan((("intermediate.dense", LowRankConfig(rank=24, keep=None)),)), few, progress=False)


def test_head_tokens_are_the_most_frequent_and_the_special_ones(calib):
    head = calib.head_tokens(8)
    assert set(calib.special_ids) <= set(head.tolist())
    rest = torch.ones_like(calib.counts, dtype=torch.bool)
    rest[head] = False
    assert calib.counts[head[len(calib.special_ids) :]].min() >= calib.counts[rest].max()


def test_a_special_token_beyond_the_table_is_not_in_the_head(calib):
    """EmbeddingGemma's tokenizer has a special image token one past its table: no text produces it."""
    beyond = dataclasses.replace(calib, special_ids=(*calib.special_ids, len(calib.counts)))
    assert beyond.head_tokens(8).tolist() == calib.head_tokens(8).tolist()


def test_data_aware_plans_need_calibration(tiny_bert_dir):
    model, _ = load_model(tiny_bert_dir)
    with pytest.raises(PlanError, match="needs calibration statistics"):
        compress_(model, Plan((("linear", LowRankConfig()),)), progress=False)


@pytest.mark.parametrize("kind", ["aware", "fisher"])
def test_lowrank_plan_round_trips_and_exports(tiny_bert_dir, calib, tmp_path, kind):
    model, source = load_model(tiny_bert_dir)
    embeddings = LowRankConfig(fit=kind, keep=0.3, dense_head=10)
    plan = Plan((("embeddings", embeddings), ("linear", LowRankConfig(fit=kind, keep=0.4))))
    assert Plan.from_json(plan.to_json()) == plan
    report = compress_(model, plan, calib, progress=False)
    assert isinstance(model.get_input_embeddings(), HeadTailEmbedding)
    assert isinstance(model.get_submodule(LINEAR[0]), LowRankLinear)
    assert report.modules[LINEAR[0]]["params_after"] < report.modules[LINEAR[0]]["params_before"]
    loaded, _ = load_model(save_compressed(model, plan, report, source, tmp_path / "ckpt"))
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    assert export_onnx(loaded, tmp_path / "m.onnx").parity_max_abs <= 1e-4


@pytest.mark.parametrize("config", [TTConfig(rank=4, dense_head=16), TTConfig(rank=4, fit="aware")])
def test_tt_with_dense_head_or_weights_exports(tiny_bert_dir, calib, tmp_path, config):
    model, _ = load_model(tiny_bert_dir)
    compress_(model, Plan((("embeddings", config),)), calib, progress=False)
    assert export_onnx(model, tmp_path / "m.onnx").parity_max_abs <= 1e-4


def test_weighted_tt_fits_the_calibration_tokens_better(tiny_bert_dir, calib):
    table = load_model(tiny_bert_dir)[0].get_input_embeddings().weight.detach()
    seen = calib.counts > 0
    errors = {}
    for fit in ("plain", "aware"):
        model, _ = load_model(tiny_bert_dir)
        compress_(model, Plan((("embeddings", TTConfig(rank=4, fit=fit)),)), calib, progress=False)
        errors[fit] = float(((model.get_input_embeddings().to_dense() - table)[seen] ** 2).sum())
    assert errors["aware"] < errors["plain"]
    with pytest.raises(PlanError, match="2 cores"):
        TTConfig(fit="aware", num_cores=3)


def test_a_rank_that_saves_nothing_leaves_the_layer_dense(tiny_bert_dir, calib):
    model, _ = load_model(tiny_bert_dir)
    report = compress_(model, Plan((("linear", LowRankConfig(rank=40, keep=None)),)), calib, progress=False)
    assert not report.modules and "would not save parameters" in report.skipped[LINEAR[0]]


@pytest.mark.parametrize("kind", ["aware", "fisher"])
def test_budget_plan_stays_within_budget(tiny_bert_dir, calib, kind):
    model, _ = load_model(tiny_bert_dir)
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not n.startswith("pooler")]
    before = sum(model.get_submodule(n).weight.numel() for n in names)
    plan = plan_for_budget(model, ["linear"], "0.5", calib, LowRankConfig(fit=kind))
    compress_(model, plan, calib, progress=False)

    def weights(m):
        return m.up.numel() + m.down.numel() if isinstance(m, LowRankLinear) else m.weight.numel()

    assert sum(weights(model.get_submodule(n)) for n in names) <= 0.5 * before
    what = {"aware": "predicted relative error", "fisher": "predicted loss increase"}[kind]
    assert any(what in note for note in plan.notes)


def test_a_fit_is_one_of_three_and_a_plan_file_of_the_old_flags_still_reads():
    with pytest.raises(PlanError, match="fit is one of plain, aware, fisher"):
        LowRankConfig(fit="clever")
    old = {"target": "linear", "method": "lowrank", "config": {"rank": 4, "keep": None, "whiten": True}}
    phm = {"target": "ffn", "method": "phm", "config": {"n": 4, "kind": "plain"}}
    old["config"].update(weighted=True, sensitive=False, dense_head=0)
    plan = Plan.from_dict({"version": 1, "entries": [old, phm]})
    assert [cfg.fit for _, cfg in plan.entries] == ["aware", "plain"]
    mixed = {**old, "config": {**old["config"], "whiten": False}}
    with pytest.raises(PlanError, match="mixes fits"):
        Plan.from_dict({"version": 1, "entries": [mixed]})
    unweighted_fisher = {"target": "embeddings", "method": "tt", "config": {"weighted": False, "sensitive": True}}
    with pytest.raises(PlanError, match="mixes fits"):
        Plan.from_dict({"version": 1, "entries": [unweighted_fisher]})


@pytest.mark.parametrize("text", ["0", "1", "1.5", "-3MB", "12parsecs", "lots"])
def test_bad_budgets_raise(text):
    with pytest.raises(PlanError):
        parse_budget(text)


def test_budget_sizes_parse():
    assert parse_budget("0.25") == ("fraction", 0.25)
    assert parse_budget("12MB") == ("bytes", 12e6)
    assert parse_budget("1MiB") == ("bytes", 2**20)


def test_token_counts_take_every_passage_cut_as_calibration_cuts_it(tiny_bert_dir):
    tok = load_tokenizer(load_model(tiny_bert_dir)[1])
    long = " ".join(["value"] * 300)
    counts = token_counts(tok, [*TEXTS, long], tok.vocab_size, max_length=128)
    value = tok.convert_tokens_to_ids("value")
    expected = sum(t.split().count("value") for t in TEXTS) + 126  # the long passage: 128 tokens less [CLS], [SEP]
    assert counts.dtype == torch.long and int(counts[value]) == expected
    assert int(counts[tok.cls_token_id]) == len(TEXTS) + 1


def test_statistics_count_a_conv1d_by_its_input_width(tmp_path):
    from compressor.dense import dense_weight
    from tests.conftest import write_tiny_lm

    model, _ = load_model(write_tiny_lm(tmp_path / "gpt2", "gpt2"))
    name = "transformer.h.0.mlp.c_fc"  # a Conv1D, its weight stored (in, out)
    rows, cols = dense_weight(model.get_submodule(name)).shape
    assert rows != cols and statistics_bytes(model, [name], False) == 8 * cols**2
