import pytest
import torch

from compressor.errors import CompressorError, PlanError
from compressor.head_tail import HeadTailEmbedding
from compressor.lowrank_linear import LowRankLinear
from converters.budget import parse_budget, plan_for_budget
from converters.calibration import cached_calibration, calibrate
from converters.checkpoint import load_model, save_compressed
from converters.compress import compress_
from converters.export import export_onnx
from converters.methods import head_tokens
from converters.plan import LowRankConfig, Plan, TTConfig
from eval.quality import load_tokenizer

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
    return calibrate(model, tok, TEXTS, ALL_LINEAR, batch=5, progress=False)


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


def test_cache_returns_the_same_statistics(tiny, tmp_path):
    model, source, tok = tiny
    first = cached_calibration(tmp_path, source, model, tok, TEXTS, LINEAR, progress=False)
    assert len(list(tmp_path.glob("calibration-*.safetensors"))) == 1
    again = cached_calibration(tmp_path, source, model, tok, TEXTS, LINEAR, progress=False)
    assert torch.equal(first.counts, again.counts) and first.special_ids == again.special_ids
    assert all(torch.equal(first.grams[n], again.grams[n]) for n in LINEAR)


def test_too_little_calibration_text_raises(tiny):
    model, _, tok = tiny
    with pytest.raises(CompressorError, match="at least 64 are needed"):
        calibrate(model, tok, ["the"], LINEAR, progress=False)


def test_head_tokens_are_the_most_frequent_and_the_special_ones(calib):
    head = head_tokens(calib, 8)
    assert set(calib.special_ids) <= set(head.tolist())
    rest = torch.ones_like(calib.counts, dtype=torch.bool)
    rest[head] = False
    assert calib.counts[head[len(calib.special_ids) :]].min() >= calib.counts[rest].max()


def test_data_aware_plans_need_calibration(tiny_bert_dir):
    model, _ = load_model(tiny_bert_dir)
    with pytest.raises(PlanError, match="needs calibration statistics"):
        compress_(model, Plan((("linear", LowRankConfig()),)), progress=False)


def test_lowrank_plan_round_trips_and_exports(tiny_bert_dir, calib, tmp_path):
    model, source = load_model(tiny_bert_dir)
    plan = Plan((("embeddings", LowRankConfig(keep=0.3, dense_head=10)), ("linear", LowRankConfig(keep=0.4))))
    report = compress_(model, plan, calib, progress=False)
    assert isinstance(model.get_input_embeddings(), HeadTailEmbedding)
    assert isinstance(model.get_submodule(LINEAR[0]), LowRankLinear)
    assert report.modules[LINEAR[0]]["params_after"] < report.modules[LINEAR[0]]["params_before"]
    loaded, _ = load_model(save_compressed(model, plan, report, source, tmp_path / "ckpt"))
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    assert export_onnx(loaded, tmp_path / "m.onnx").parity_max_abs <= 1e-4


def test_tt_tail_with_dense_head_exports(tiny_bert_dir, calib, tmp_path):
    model, _ = load_model(tiny_bert_dir)
    compress_(model, Plan((("embeddings", TTConfig(rank=4, dense_head=16)),)), calib, progress=False)
    assert export_onnx(model, tmp_path / "m.onnx").parity_max_abs <= 1e-4


def test_a_rank_that_saves_nothing_leaves_the_layer_dense(tiny_bert_dir, calib):
    model, _ = load_model(tiny_bert_dir)
    report = compress_(model, Plan((("linear", LowRankConfig(rank=40, keep=None)),)), calib, progress=False)
    assert not report.modules and "would not save parameters" in report.skipped[LINEAR[0]]


def test_budget_plan_stays_within_budget(tiny_bert_dir, calib):
    model, _ = load_model(tiny_bert_dir)
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not n.startswith("pooler")]
    before = sum(model.get_submodule(n).weight.numel() for n in names)
    plan = plan_for_budget(model, ["linear"], "0.5", calib)
    compress_(model, plan, calib, progress=False)

    def weights(m):
        return m.up.numel() + m.down.numel() if isinstance(m, LowRankLinear) else m.weight.numel()

    assert sum(weights(model.get_submodule(n)) for n in names) <= 0.5 * before
    assert any("predicted relative error" in note for note in plan.notes)


@pytest.mark.parametrize("text", ["0", "1", "1.5", "-3MB", "12parsecs", "lots"])
def test_bad_budgets_raise(text):
    with pytest.raises(PlanError):
        parse_budget(text)


def test_budget_sizes_parse():
    assert parse_budget("0.25") == ("fraction", 0.25)
    assert parse_budget("12MB") == ("bytes", 12e6)
    assert parse_budget("1MiB") == ("bytes", 2**20)
