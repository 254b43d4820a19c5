"""DeFINE through the registry: plans, compress_ (plain, aware, fisher, behind a dense head),
checkpoints, the three export forms (each with ONNX parity; cached and hybrid equal to the unit on
every token) and the command line, with its bad input."""

import json

import pytest
import torch
from torch import nn

from compressor.define_embedding import DefineEmbedding
from compressor.define_fit import weighted_error
from compressor.define_hybrid import HybridEmbedding
from compressor.errors import CompressorError, PlanError, RankError, ShapeError
from compressor.head_tail import HeadTailEmbedding
from converters.calibration import Calibration, calibrate
from converters.checkpoint import load_model, save_compressed
from converters.cli import main
from converters.compress import compress_
from converters.export import export_onnx, in_export_form
from converters.methods.define import DefineConfig
from converters.plan import Plan
from texts.tokens import load_tokenizer

TEXTS = [f"the value {i} of list and dict is a string in python module" * (1 + i % 3) for i in range(24)]
SHAPE = dict(n=8, k=32, layers=2, max_groups=2)  # widths 8 → 20 → 32 on the tiny BERT's 48-wide table
WORD = "embeddings.word_embeddings"
TINY = ["--define-n", 8, "--define-k", 32, "--define-layers", 2, "--define-groups", 2]


@pytest.fixture(autouse=True)
def few_fit_steps(monkeypatch):
    monkeypatch.setattr("compressor.define_fit.FIT_STEPS", 20)


@pytest.fixture(scope="module")
def calib(tiny_bert_dir):
    model, source = load_model(tiny_bert_dir)
    return calibrate(model, load_tokenizer(source), TEXTS, [], batch=6, progress=False, sensitivity=True)


def compressed(tiny_bert_dir, cfg, calibration=None):
    model, source = load_model(tiny_bert_dir)
    plan = Plan((("embeddings", cfg),))
    return model, source, plan, compress_(model, plan, calibration, progress=False)


def test_plan_round_trips_and_labels():
    plan = Plan((("embeddings", DefineConfig(fit="aware", dense_head=16)),))
    assert Plan.from_json(plan.to_json()) == plan
    assert plan.label() == "define-head16-n64-k1024-l3-g4-aware"


@pytest.mark.parametrize("kind, head", [("plain", 0), ("aware", 0), ("fisher", 0), ("fisher", 16)])
def test_compress_save_load(tiny_bert_dir, calib, tmp_path, kind, head):
    model, source, plan, report = compressed(tiny_bert_dir, DefineConfig(**SHAPE, fit=kind, dense_head=head), calib)
    table = model.get_input_embeddings()
    unit = table.tail if head else table
    assert isinstance(unit, DefineEmbedding) and isinstance(table, HeadTailEmbedding) == bool(head)
    assert report.modules[WORD]["params_after"] == head * 48 + unit.spec.params() < 132 * 48
    loaded, _ = load_model(save_compressed(model, plan, report, source, tmp_path / "ckpt"))
    assert type(loaded.get_input_embeddings()) is type(table)
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in model.state_dict().items())


def test_the_aware_fit_weighs_the_frequent_rows(tiny_bert_dir, calib):
    dense = load_model(tiny_bert_dir)[0].get_input_embeddings().weight.detach()
    freq = calib.counts.double() + 1.0
    errors = {
        kind: weighted_error(
            compressed(tiny_bert_dir, DefineConfig(**SHAPE, fit=kind), calib)[0].get_input_embeddings(), dense, freq
        )
        for kind in ("plain", "aware")
    }
    assert errors["aware"] < errors["plain"]


def frequencies(calib):
    return lambda: calib


@pytest.mark.parametrize("head", [0, 16])
def test_three_export_forms_agree_with_the_unit_and_with_onnx(tiny_bert_dir, calib, tmp_path, head):
    model, *_ = compressed(tiny_bert_dir, DefineConfig(**SHAPE, fit="aware", dense_head=head), calib)
    table = model.get_input_embeddings()
    every = torch.arange(table.num_embeddings)
    ids, mask = torch.randint(0, 132, (2, 9)), torch.ones(2, 9, dtype=torch.long)
    with torch.no_grad():
        expected = table(every)
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    forms = ["compute", "cache"] + ([] if head else ["hybrid"])
    for form in forms:
        exported = in_export_form(model, {"define_export": form, "define_head": 20}, frequencies(calib))
        table = exported.get_input_embeddings()
        kind = {
            "compute": HeadTailEmbedding if head else DefineEmbedding,
            "cache": nn.Embedding,
            "hybrid": HybridEmbedding,
        }[form]
        assert type(table) is kind
        with torch.no_grad():
            assert torch.allclose(table(every), expected, atol=1e-5), form  # every token, every form
            assert torch.allclose(exported(input_ids=ids, attention_mask=mask).last_hidden_state, hidden, atol=1e-4)
        assert export_onnx(exported, tmp_path / f"{form}.onnx").parity_max_abs <= 1e-4
    assert isinstance(model.get_input_embeddings(), HeadTailEmbedding if head else DefineEmbedding)  # untouched


def test_the_hybrid_head_holds_the_most_frequent_tokens(tiny_bert_dir, calib):
    model, *_ = compressed(tiny_bert_dir, DefineConfig(**SHAPE, fit="plain"))
    hybrid = in_export_form(model, {"define_export": "hybrid", "define_head": 10}, frequencies(calib))
    table = hybrid.get_input_embeddings()
    assert set(torch.nonzero(table.permutation < 10).squeeze(1).tolist()) == set(calib.head_tokens(10).tolist())
    assert table.tail.num_embeddings == 122


@pytest.mark.parametrize(
    "values, message",
    [
        ({"define_export": "hybrid", "define_head": 132}, "--define-head must be 1 to 131 rows"),
        ({"define_export": "hybrid", "define_head": 0}, "--define-head must be 1 to 131 rows"),
    ],
)
def test_bad_hybrid_heads_are_refused(tiny_bert_dir, calib, values, message):
    model, *_ = compressed(tiny_bert_dir, DefineConfig(**SHAPE, fit="plain"))
    with pytest.raises(CompressorError, match=message):
        in_export_form(model, values, frequencies(calib))


def test_a_form_of_a_model_without_a_unit_or_behind_a_head_is_refused(tiny_bert_dir, calib):
    original, _ = load_model(tiny_bert_dir)
    with pytest.raises(CompressorError, match="--define-export cache needs a model with a DeFINE unit; this one has"):
        in_export_form(original, {"define_export": "cache"}, frequencies(calib))
    headed, *_ = compressed(tiny_bert_dir, DefineConfig(**SHAPE, fit="plain", dense_head=8), calib)
    with pytest.raises(CompressorError, match="already sits behind a dense head of 8 rows"):
        in_export_form(headed, {"define_export": "hybrid"}, frequencies(calib))
    assert in_export_form(original, {"define_export": "compute"}, frequencies(calib)) is original


@pytest.mark.parametrize("form", ["compute", "cache", "hybrid"])
def test_a_tied_lm_scores_through_the_unit_in_each_form(tiny_llama_dir, tmp_path, form):
    model, *_ = compressed(tiny_llama_dir, DefineConfig(**SHAPE, fit="plain"))
    vocab = model.get_input_embeddings().num_embeddings
    counts = Calibration({}, torch.arange(vocab, 0, -1), ())
    exported = in_export_form(model, {"define_export": form, "define_head": 12}, lambda: counts)
    ids = torch.randint(0, vocab, (2, 7))
    with torch.no_grad():
        hidden = exported.model(input_ids=ids).last_hidden_state
        table = model.get_input_embeddings().to_dense()
        assert torch.allclose(exported(input_ids=ids).logits, hidden @ table.T, atol=1e-4)
    assert export_onnx(exported, tmp_path / f"{form}.onnx").parity_max_abs <= 1e-3


@pytest.mark.parametrize(
    "config, error, message",
    [
        (dict(n=30, k=1024), ShapeError, "layer 1 cuts 30 and 361 into 4"),
        (dict(layers=0), RankError, "layers N must be an integer ≥ 1, got 0"),
        (dict(fit="clever"), PlanError, "fit is one of plain, aware, fisher"),
        (dict(dense_head=-1), PlanError, "a dense head must be a number of rows ≥ 0"),
    ],
)
def test_bad_configs_raise(config, error, message):
    with pytest.raises(error, match=message):
        DefineConfig(**config)


def test_a_unit_that_saves_nothing_leaves_the_table_dense(tiny_bert_dir):
    model, _, _, report = compressed(tiny_bert_dir, DefineConfig(n=40, k=96, layers=1, max_groups=1, fit="plain"))
    assert not report.modules and "would not save any of a 132×48 table" in report.skipped[WORD]


def run_cli(argv, capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def test_the_command_line_compresses_and_exports_each_form(tiny_bert_dir, tmp_path, capsys, eval_text_file):
    ckpt = tmp_path / "ckpt"
    options = [*TINY, "--kind", "aware"]
    texts = ["--calib", eval_text_file, "--freq-prior", "none"]
    code, err = run_cli(["compress", tiny_bert_dir, "--method", "define", *options, *texts, "--out", ckpt], capsys)
    assert code == 0, err
    assert isinstance(load_model(ckpt)[0].get_input_embeddings(), DefineEmbedding)
    for form in ("compute", "cache", "hybrid"):
        out = tmp_path / f"{form}.onnx"
        argv = ["export", ckpt, "--define-export", form, "--define-head", 12, *texts, "--out", out]
        code, err = run_cli(argv, capsys)
        assert code == 0 and out.is_file(), err


def test_run_measures_each_form_side_by_side(tiny_bert_dir, tmp_path, capsys, eval_text_file, monkeypatch):
    monkeypatch.setattr("eval.benchmark.SETTINGS", ((1, 16, 1),))
    out = tmp_path / "run"
    argv = ["run", tiny_bert_dir, "--method", "define", *TINY, "--kind", "plain"]
    argv += ["--define-export", "compute", "cache", "hybrid"]
    argv += ["--define-head", 16, "--calib", eval_text_file, "--freq-prior", "none", "--eval-text", eval_text_file]
    code, err = run_cli([*argv, "--second-text", "none", "--runs", 2, "--out", out], capsys)
    assert code == 0, err
    rows = {v["name"]: v for v in json.loads((out / "report.json").read_text())["variants"]}
    name = "define-n8-k32-l2-g2-plain"
    assert list(rows) == ["original", "original-int8", name, f"{name}-cache", f"{name}-hybrid"]
    assert rows[name]["params"] < rows[f"{name}-hybrid"]["params"] < rows[f"{name}-cache"]["params"]
    assert rows[f"{name}-hybrid"]["export_form"] == {"define_export": "hybrid", "define_head": 16}
    assert all(rows[n]["parity_max_abs"] <= 1e-4 for n in list(rows)[2:])
    assert rows[f"{name}-cache"]["quality"]["cosine_mean"] == pytest.approx(
        rows[name]["quality"]["cosine_mean"], abs=1e-5
    )


@pytest.mark.parametrize(
    "command, options, message",
    [
        (
            "compress",
            ["--method", "define", "--define-n", 48, "--define-k", 96, "--define-layers", 1],
            "the DeFINE map width n = 48 must be below the table's width 48",
        ),
        ("compress", ["--method", "define", "--define-layers", 0], "layers N must be an integer ≥ 1, got 0"),
        ("compress", ["--method", "define", "--define-k", 1030], "layer 1 cuts 386 into 4; k = 1025 or k = 1036"),
        ("compress", ["--method", "define", *TINY, "--dense-head", 132], "a dense head of 132 rows leaves no tail"),
        ("export", ["--define-export", "cache"], "--define-export cache needs a model with a DeFINE unit"),
        ("run", ["--method", "lowrank", "--define-export", "hybrid"], "hybrid needs a DeFINE unit, and no plan makes"),
        (
            "run",
            ["--method", "define", *TINY, "--define-export", "hybrid", "--define-head", 132],
            "--define-head must be 1 to 131 rows",
        ),
    ],
)
def test_bad_input_is_one_sentence_and_writes_nothing(
    tiny_bert_dir, tmp_path, capsys, monkeypatch, command, options, message
):
    def no_calibration(*args, **kwargs):
        raise AssertionError("calibrated before the input was checked")

    def no_texts(*args, **kwargs):  # a run's plans and export forms are checked before its texts are read
        raise AssertionError("read the texts before the input was checked")

    monkeypatch.setattr("converters.pipeline.calibrating.cached_calibration", no_calibration)
    monkeypatch.setattr("converters.pipeline.measuring.eval_texts", no_texts)
    out = tmp_path / ("o.onnx" if command == "export" else "o")
    code, err = run_cli([command, tiny_bert_dir, *options, "--out", out], capsys)
    lines = [line for line in err.splitlines() if line.startswith("compressor: error:")]
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert not out.exists()
