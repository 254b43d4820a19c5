import pytest
import torch

import converters.finetune.data as fd
import converters.finetune.distil as ft
import converters.finetune.loss as fl
from compressor.errors import CompressorError
from converters.checkpoint import load_model, save_compressed
from converters.compress import compress_
from converters.export import export_onnx
from converters.finetune import Distillation, FinetuneRun, finetune_
from converters.finetune.config import FinetuneConfig
from converters.kinds.encoder import ENCODER
from converters.methods.lowrank import LowRankConfig
from converters.methods.tt import TTConfig
from converters.plan import Plan
from converters.registry import compact_modules
from texts.tokens import load_tokenizer

TEXTS = [f"the {w} value of a list is a string in python module number {i}" for i, w in enumerate("abcdefgh" * 4)]
COMPACT = tuple(compact_modules().values())
PLAN = Plan((("embeddings", TTConfig(rank=2, order="none")),))


@pytest.fixture
def pair(tiny_bert_dir):
    teacher, source = load_model(tiny_bert_dir)
    student, _ = load_model(tiny_bert_dir)
    report = compress_(student, PLAN, progress=False)
    return student, teacher, source, report


def loss_on(student, teacher, tok, cfg):
    batches = fd.batches(tok, TEXTS, cfg)
    target = fl.validation_targets(ENCODER, teacher, batches, torch.device("cpu"))
    with torch.no_grad():
        return sum(
            float(ENCODER.distill_loss(ENCODER.output(student, i, m), target(k), m, cfg))
            for k, (i, m) in enumerate(batches)
        )


def test_a_few_steps_lower_the_loss_and_train_only_the_compressed_layers(pair):
    student, teacher, source, _ = pair
    tok = load_tokenizer(source)
    cfg = FinetuneConfig(steps=30, seconds=None, lr=1e-2, batch_size=8, eval_every=10)
    frozen = {k: v.clone() for k, v in student.state_dict().items() if "word_embeddings" not in k}
    before = loss_on(student, teacher, tok, cfg)
    report = finetune_(Distillation(student, teacher, tok, TEXTS, TEXTS[:8], COMPACT), cfg, FinetuneRun(progress=False))
    assert report.steps == 30 and report.device == "cpu"
    lengths = [len(w) for w in fd.windows(tok, TEXTS, cfg.max_length)]  # the real tokens of each step's 8 windows
    assert 30 * 8 * min(lengths) <= report.tokens <= 30 * 8 * max(lengths)
    assert report.to_dict()["tokens_per_second"] == round(report.tokens / report.seconds)
    assert loss_on(student, teacher, tok, cfg) < before
    assert report.best_step > 0 and report.best_val_cosine > report.start_val_cosine
    val = fd.batches(tok, TEXTS[:8], cfg)
    kept = fl.agreement(ENCODER, student, val, fl.validation_targets(ENCODER, teacher, val, "cpu"), "cpu")
    assert kept == pytest.approx(report.best_val_cosine, abs=1e-6)  # the best weights are the ones kept
    after = student.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in frozen.items())  # frozen weights bit-identical
    assert report.trainable_params == student.get_input_embeddings().weight_like_params


def test_validation_targets_past_the_bound_are_made_at_each_call(pair, monkeypatch):
    """Held targets are the teacher's at the start; past HELD_TARGET_BYTES each call runs the teacher again: the same
    values while it is unchanged, the same agreement."""
    student, teacher, source, _ = pair
    val = fd.batches(load_tokenizer(source), TEXTS, FinetuneConfig(batch_size=8))
    held = fl.validation_targets(ENCODER, teacher, val, "cpu")
    monkeypatch.setattr(fl, "HELD_TARGET_BYTES", 0)
    made = fl.validation_targets(ENCODER, teacher, val, "cpu")
    assert len(val) > 1
    for i in range(len(val)):
        torch.testing.assert_close(made(i), held(i), rtol=1e-5, atol=1e-5)
    score = fl.agreement(ENCODER, student, val, held, "cpu")
    assert fl.agreement(ENCODER, student, val, made, "cpu") == pytest.approx(score, abs=1e-5)
    with torch.no_grad():
        teacher.get_input_embeddings().weight.mul_(2)
    assert float((made(0) - held(0)).abs().max()) > 0.1  # made again from the teacher, not kept (1.8 here)


def test_all_trains_the_rest_at_its_own_learning_rate(pair, monkeypatch):
    student, teacher, source, _ = pair
    seen, adamw = [], torch.optim.AdamW
    monkeypatch.setattr(ft.torch.optim, "AdamW", lambda groups, **kw: seen.append(groups) or adamw(groups, **kw))
    cfg = FinetuneConfig(steps=3, seconds=None, lr=1e-2, rest_lr=1e-3, trainable="all", batch_size=8, eval_every=1)
    report = finetune_(
        Distillation(student, teacher, load_tokenizer(source), TEXTS, TEXTS[:8], COMPACT),
        cfg,
        FinetuneRun(progress=False),
    )
    compact, rest = seen[0]
    assert (compact["initial_lr"], rest["initial_lr"]) == (1e-2, 1e-3)
    assert {id(p) for p in compact["params"]} == {id(p) for p in student.get_input_embeddings().parameters()}
    assert any(p is student.encoder.layer[0].attention.self.query.weight for p in rest["params"])
    assert report.trainable_params == sum(p.numel() for p in student.parameters())


@pytest.mark.parametrize(
    "schedule, step, elapsed, factor",
    [
        ("constant", 5, 50.0, 1.0),
        ("linear", 0, 0.0, 0.1),
        ("linear", 9, 0.0, 0.91),
        ("linear", 50, 10.0, 0.5),
        ("linear", 20, 75.0, 0.25),
        ("linear", 100, 100.0, 0.0),
    ],
)
def test_learning_rate_schedule(schedule, step, elapsed, factor):
    cfg = FinetuneConfig(steps=100, seconds=100.0, schedule=schedule, warmup_steps=10)
    assert ft._lr_factor(cfg, step, elapsed) == pytest.approx(factor)


def test_distill_loss_terms():
    torch.manual_seed(0)
    h_t, mask = torch.randn(4, 5, 8), torch.ones(4, 5)
    mask[0, 3:] = 0
    at_thrice = {"cosine_weight": 0.0, "hidden_weight": 4.0}  # h_s = 3 h_t: same directions, ‖h_s − h_t‖² = 4‖h_t‖²
    for term, expected in at_thrice.items():
        cfg = FinetuneConfig(**{**dict.fromkeys(at_thrice, 0.0), term: 1.0})
        assert float(ENCODER.distill_loss(h_t, h_t, mask, cfg)) == pytest.approx(0.0, abs=1e-6)
        assert float(ENCODER.distill_loss(3 * h_t, h_t, mask, cfg)) == pytest.approx(expected, abs=1e-5)
        assert float(ENCODER.distill_loss(torch.randn(4, 5, 8), h_t, mask, cfg)) > 0.01
    padded = h_t.clone()
    padded[0, 3:] = 100.0  # what padding holds is ignored
    assert float(ENCODER.distill_loss(padded, h_t, mask, FinetuneConfig())) == pytest.approx(0.0, abs=1e-6)


def test_finetuned_checkpoint_round_trips_and_exports(pair, tmp_path):
    student, teacher, source, report = pair
    cfg = FinetuneConfig(steps=5, seconds=None, batch_size=8, eval_every=5)
    result = finetune_(
        Distillation(student, teacher, load_tokenizer(source), TEXTS, TEXTS[:4], COMPACT),
        cfg,
        FinetuneRun(progress=False),
    )
    path = save_compressed(student, PLAN, report, source, tmp_path / "ft", finetune=result.to_dict())
    loaded, _ = load_model(path)
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in student.state_dict().items())
    assert export_onnx(loaded, tmp_path / "ft.onnx").parity_max_abs <= 1e-4


def test_nan_loss_stops_and_keeps_the_best_weights(pair, monkeypatch):
    student, teacher, source, _ = pair
    start = {k: v.clone() for k, v in student.state_dict().items()}
    real = type(ENCODER).distill_loss
    calls = iter(range(100))

    def poisoned(*args):
        loss = real(*args)
        return loss * float("nan") if next(calls) >= 2 else loss

    monkeypatch.setattr(type(ENCODER), "distill_loss", poisoned)
    cfg = FinetuneConfig(steps=10, seconds=None, batch_size=8, eval_every=100)
    report = finetune_(
        Distillation(student, teacher, load_tokenizer(source), TEXTS, TEXTS[:4], COMPACT),
        cfg,
        FinetuneRun(progress=False),
    )
    assert "at step 3" in report.stopped and report.steps == 2
    assert all(torch.isfinite(v).all() for v in student.state_dict().values() if v.is_floating_point())
    assert all(torch.equal(v, start[k]) for k, v in student.state_dict().items())  # no eval beat the start


def test_zero_steps_skip(pair):
    student, teacher, source, _ = pair
    report = finetune_(
        Distillation(student, teacher, None, TEXTS, TEXTS, COMPACT),
        FinetuneConfig(steps=0),
        FinetuneRun(progress=False),
    )
    assert report.steps == 0 and "skipped" in report.stopped


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"steps": None, "seconds": None}, "step budget"),
        ({"steps": -1}, "≥ 0"),
        ({"seconds": 0}, "> 0 seconds"),
        ({"trainable": "some"}, "trainable"),
        ({"schedule": "cosine"}, "schedule"),
        ({"rest_lr": 0.0}, "learning rate"),
        ({"linear_lr": -1.0}, "learning rate"),
        ({"rare_share": 1.5}, "rare share"),
        ({"synthetic": -0.1}, "synthetic"),
        ({"synthetic": 1.0}, "leaves no text"),
        ({"layer_weight": -1.0}, "per-layer"),
        ({"device": "tpu"}, "device must be one of auto, cpu, cuda"),
        *([({"device": "cuda"}, "sees no GPU")] if not torch.cuda.is_available() else []),
    ],
)
def test_bad_configs_raise(kwargs, message):
    with pytest.raises(CompressorError, match=message):
        FinetuneConfig(**kwargs)


def test_no_data_raises(pair):
    student, teacher, source, _ = pair
    with pytest.raises(CompressorError, match="no fine-tune text"):
        finetune_(Distillation(student, teacher, load_tokenizer(source), [], TEXTS, COMPACT), FinetuneConfig(steps=2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine")
def test_gpu_path_lowers_the_loss(pair):
    student, teacher, source, _ = pair
    cfg = FinetuneConfig(steps=20, seconds=None, lr=1e-2, batch_size=8, eval_every=10)
    report = finetune_(
        Distillation(student, teacher, load_tokenizer(source), TEXTS, TEXTS[:8], COMPACT),
        cfg,
        FinetuneRun(progress=False),
    )
    assert report.device.startswith("cuda") and report.best_val_cosine > report.start_val_cosine


def test_batches_cover_whole_passages_in_windows(tiny_bert_dir):
    tok = load_tokenizer(load_model(tiny_bert_dir)[1])
    long_text = " ".join(TEXTS)
    cfg = FinetuneConfig(max_length=16, batch_size=4)
    batches = fd.batches(tok, [long_text], cfg)
    words = tok(long_text, add_special_tokens=False)["input_ids"]
    windows = [row[mask.bool()].tolist() for ids, masks in batches for row, mask in zip(ids, masks)]
    assert len(windows) > 1 and all(len(w) <= 16 for w in windows)
    assert all(w[0] == tok.cls_token_id and w[-1] == tok.sep_token_id for w in windows)
    assert sorted(t for w in windows for t in w[1:-1]) == sorted(words)  # every token once, none cut off


def test_the_process_thread_setting_is_restored(pair):
    student, teacher, source, _ = pair
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the fine-tune uses every core, then gives the setting back
    try:
        cfg = FinetuneConfig(steps=1, seconds=None, batch_size=8)
        finetune_(
            Distillation(student, teacher, load_tokenizer(source), TEXTS, TEXTS[:4], COMPACT),
            cfg,
            FinetuneRun(progress=False),
        )
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def layer_loss_on(student, teacher, tok, cfg):
    batches = fd.batches(tok, TEXTS, cfg)
    with torch.no_grad():
        return sum(
            float(fl.layer_loss(ENCODER.outputs(student, i, m)[1], ENCODER.outputs(teacher, i, m)[1], m))
            for i, m in batches
        )


def test_per_layer_matching_lowers_the_summed_layer_loss(tiny_bert_dir):
    teacher, source = load_model(tiny_bert_dir)
    student, _ = load_model(tiny_bert_dir)
    plain = LowRankConfig(rank=2, fit="plain")
    plan = Plan((("embeddings", TTConfig(rank=2, order="none")), ("linear", plain)))
    compress_(student, plan, progress=False)
    tok = load_tokenizer(source)
    cfg = FinetuneConfig(
        steps=30,
        seconds=None,
        lr=1e-2,
        linear_lr=1e-3,
        batch_size=8,
        eval_every=10,
        cosine_weight=0.0,
        hidden_weight=0.0,
        layer_weight=1.0,
    )
    before = layer_loss_on(student, teacher, tok, cfg)
    finetune_(Distillation(student, teacher, tok, TEXTS, TEXTS[:8], COMPACT), cfg, FinetuneRun(progress=False))
    after = layer_loss_on(student, teacher, tok, cfg)
    assert after < 0.9 * before


def test_layer_loss_is_the_mean_relative_error_of_the_layers():
    torch.manual_seed(0)
    teacher = tuple(torch.randn(2, 3, 4) for _ in range(3))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    student = (teacher[0], 2 * teacher[1], teacher[2].clone())
    student[2][0, 2] += 100.0  # padding: ignored
    assert float(fl.layer_loss(student, teacher, mask)) == pytest.approx(1 / 3, abs=1e-6)


def test_linear_factors_and_tables_train_at_their_own_rates(tiny_bert_dir, monkeypatch):
    teacher, source = load_model(tiny_bert_dir)
    student, _ = load_model(tiny_bert_dir)
    plain = LowRankConfig(rank=4, fit="plain")
    plan = Plan((("embeddings", TTConfig(rank=2, order="none")), ("ffn", plain)))
    compress_(student, plan, progress=False)
    seen, adamw = [], torch.optim.AdamW
    monkeypatch.setattr(ft.torch.optim, "AdamW", lambda groups, **kw: seen.append(groups) or adamw(groups, **kw))
    cfg = FinetuneConfig(steps=1, seconds=None, lr=1e-2, linear_lr=1e-3, batch_size=8)
    finetune_(
        Distillation(student, teacher, load_tokenizer(source), TEXTS, TEXTS[:8], COMPACT),
        cfg,
        FinetuneRun(progress=False),
    )
    tables, linear = seen[0]
    assert (tables["initial_lr"], linear["initial_lr"]) == (1e-2, 1e-3)
    assert {id(p) for p in tables["params"]} == {id(p) for p in student.get_input_embeddings().parameters()}
    ffn = student.encoder.layer[0].intermediate.dense
    assert {id(p) for p in ffn.parameters()} <= {id(p) for p in linear["params"]}


def test_rare_windows_are_drawn_more_often():
    windows = [[0, 1, 2], [0, 1, 2], [0, 1, 2], [0, 1, 9]]  # token 9 appears once
    uniform, rare = fd.window_weights(windows, 0.0), fd.window_weights(windows, 1.0)
    assert torch.allclose(uniform, torch.full((4,), 0.25, dtype=torch.float64), atol=1e-12)
    # r_i = Σ 1/count over distinct tokens: 1/4 + 1/4 + 1/3 for the common windows, 1/4 + 1/4 + 1 for the rare one
    assert torch.allclose(rare, torch.tensor([5 / 24, 5 / 24, 5 / 24, 3 / 8], dtype=torch.float64), atol=1e-12)
    assert torch.allclose(fd.window_weights(windows, 0.5), (uniform + rare) / 2, atol=1e-6)


def test_synthetic_windows_draw_from_the_prior_between_special_tokens(tiny_bert_dir):
    tok = load_tokenizer(load_model(tiny_bert_dir)[1])
    prior = torch.zeros(tok.vocab_size, dtype=torch.float64)
    allowed = tok.convert_tokens_to_ids(["python", "module", tok.cls_token])
    prior[allowed] = 1 / 3  # a special token in the prior is never drawn
    rows = fd.synthetic_windows(tok, prior, 5, 12, torch.Generator().manual_seed(0))
    assert len(rows) == 5 and all(len(r) == 12 and r[0] == tok.cls_token_id and r[-1] == tok.sep_token_id for r in rows)
    assert {t for r in rows for t in r[1:-1]} <= set(allowed[:2])


def test_synthetic_sequences_need_a_prior(pair):
    student, teacher, source, _ = pair
    cfg = FinetuneConfig(steps=1, synthetic=0.25)
    with pytest.raises(CompressorError, match="prior"):
        finetune_(
            Distillation(student, teacher, load_tokenizer(source), TEXTS, TEXTS, COMPACT),
            cfg,
            FinetuneRun(progress=False),
        )


def test_the_student_trains_without_dropout(pair, monkeypatch):
    student, teacher, source, _ = pair
    modes, real = [], type(ENCODER).outputs

    def watched(self, model, ids, mask):
        modes.append((model is student, any(m.training for m in model.modules())))
        return real(self, model, ids, mask)

    monkeypatch.setattr(type(ENCODER), "outputs", watched)
    cfg = FinetuneConfig(steps=2, seconds=None, batch_size=8)
    finetune_(
        Distillation(student, teacher, load_tokenizer(source), TEXTS, TEXTS[:4], COMPACT),
        cfg,
        FinetuneRun(progress=False),
    )
    assert (True, False) in modes and all(not training for _, training in modes)
