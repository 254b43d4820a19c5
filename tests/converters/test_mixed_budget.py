"""One budget over low-rank and PHM layers (and PHM alone): the plan mixes methods layer by layer,
stays within the budget, loses no more with more budget, estimates exactly (low-rank) or from
above (PHM); bad input is one sentence before any calibration."""

import json
import re

import pytest
import torch
from transformers import BertModel

from compressor.errors import PlanError, ShapeError
from compressor.lowrank import SENSITIVITY_DAMP, cholesky_whitener
from compressor.lowrank_linear import LowRankLinear
from compressor.phm import kron_sum_to_dense
from compressor.phm_fit import kron_sum_metric_error, output_metrics
from compressor.phm_linear import PHMLinear
from converters.budget import plan_for_budget
from converters.calibration import calibrate
from converters.checkpoint import load_model
from converters.cli import main
from converters.compress import compress_
from converters.methods.lowrank import LowRankConfig
from converters.methods.phm import PHMConfig
from converters.methods.tt import TTConfig
from tests.conftest import write_tiny_bert
from tests.converters.test_calibration import ALL_LINEAR as LINEAR
from tests.converters.test_calibration import TEXTS
from texts.tokens import load_tokenizer

KRON = ["encoder.layer.0.intermediate.dense", "encoder.layer.0.output.dense"]  # exact 2-term Kronecker sums at n = 4
THIN = [f"encoder.layer.1.attention.self.{p}" for p in ("query", "key", "value")]  # exact rank 4


@pytest.fixture(scope="module")
def mixed_bert_dir(tmp_path_factory):
    """The tiny BERT with two layers that a Kronecker sum holds exactly and three that low rank does."""
    path = write_tiny_bert(tmp_path_factory.mktemp("mixed") / "bert")
    model = BertModel.from_pretrained(path)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name in KRON:
            layer = model.get_submodule(name)
            rows, cols = layer.weight.shape
            a, s = torch.randn(2, 4, 4, generator=g), torch.randn(2, rows // 4, cols // 4, generator=g)
            layer.weight.copy_(kron_sum_to_dense(a, s) * 0.02)
        for name in THIN:
            layer = model.get_submodule(name)
            layer.weight.copy_(torch.randn(48, 4, generator=g) @ torch.randn(4, 48, generator=g) * 0.02)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def calib(mixed_bert_dir):
    model, source = load_model(mixed_bert_dir)
    return calibrate(model, load_tokenizer(source), TEXTS, LINEAR, batch=6, progress=False, sensitivity=True)


def predicted(plan) -> dict[str, float]:
    """Module name → the predicted error its note gives."""
    found = (re.match(r"(\S+): .*predicted .* ([0-9.e+-]+)$", note) for note in plan.notes)
    return {m.group(1): float(m.group(2)) for m in found if m}


def weights(module) -> int:
    if isinstance(module, LowRankLinear):
        return module.up.numel() + module.down.numel()
    if isinstance(module, PHMLinear):
        return module.a.numel() + module.s.numel()
    return module.weight.numel()


def both(kind: str) -> list:
    return [LowRankConfig(fit=kind), PHMConfig(n=4, fit=kind)]


@pytest.mark.parametrize("kind", ["fisher", "aware", "plain"])
@pytest.mark.parametrize("budget", ["0.3", "0.5", "0.7"])
def test_the_budget_is_never_exceeded_with_both_methods_allowed(mixed_bert_dir, calib, kind, budget):
    model, _ = load_model(mixed_bert_dir)
    before = sum(model.get_submodule(n).weight.numel() for n in LINEAR)
    plan = plan_for_budget(model, ["linear"], budget, calib, both(kind))
    compress_(model, plan, calib, progress=False)
    assert sum(weights(model.get_submodule(n)) for n in LINEAR) <= float(budget) * before
    assert plan.name == f"lowrank+phm-budget{budget}-{kind}"


def test_each_layer_gets_the_method_that_holds_it_best_and_the_notes_say_which(mixed_bert_dir, calib):
    model, _ = load_model(mixed_bert_dir)
    plan = plan_for_budget(model, ["linear"], "0.5", calib, both("fisher"))
    configs = dict(plan.entries)
    assert all(isinstance(configs[n], PHMConfig) for n in KRON)
    assert all(isinstance(configs[n], LowRankConfig) for n in THIN)
    phm = sum(isinstance(c, PHMConfig) for c in configs.values())
    assert (
        f"layers by method: lowrank {len(configs) - phm}, phm {phm}, dense {len(LINEAR) - len(configs)}" in plan.notes
    )
    assert f"{KRON[0]}: phm, terms {configs[KRON[0]].terms}, predicted loss increase" in " ".join(plan.notes)
    assert all(predicted(plan)[n] < 1e-6 for n in KRON + THIN)  # held exactly


def test_estimates_are_exact_for_low_rank_and_from_above_for_phm(mixed_bert_dir, calib):
    """Low-rank fisher truncates in the metric it estimates; PHM's refit starts from the nearest
    Kronecker sum whose error is the estimate, and never raises it."""
    model, _ = load_model(mixed_bert_dir)
    plan = plan_for_budget(model, ["linear"], "0.3", calib, both("fisher"))
    dense = {n: model.get_submodule(n).weight.detach().clone() for n in LINEAR}
    compress_(model, plan, calib, progress=False)
    notes = {n: e for n, e in predicted(plan).items() if n in dict(plan.entries)}  # not the layers kept dense
    assert {type(model.get_submodule(n)) for n in notes} == {LowRankLinear, PHMLinear}
    for name, estimate in notes.items():
        gx, gy = output_metrics(calib.gram(name), calib.sensitivity(name), *dense[name].shape)
        layer = model.get_submodule(name)
        if isinstance(layer, PHMLinear):
            loss = kron_sum_metric_error(layer.a.detach(), layer.s.detach(), dense[name], gx, gy)
            assert loss <= estimate * (1 + 1e-3) + 1e-12, name
        else:
            root_y = cholesky_whitener(calib.sensitivity(name), SENSITIVITY_DAMP)[0]
            root_x = cholesky_whitener(calib.gram(name))[0]
            delta = (dense[name] - layer.to_dense().detach()).to(torch.float64)
            loss = float((root_y.T @ delta @ root_x).pow(2).sum())
            assert loss == pytest.approx(estimate, rel=2e-3, abs=1e-9), name


@pytest.mark.parametrize("configs", [both("fisher"), both("aware"), [PHMConfig(n=4, fit="fisher")]])
def test_more_budget_never_gives_a_larger_summed_estimate(mixed_bert_dir, calib, configs):
    model, _ = load_model(mixed_bert_dir)
    totals = [
        sum(predicted(plan_for_budget(model, ["linear"], f"{b:.2f}", calib, configs)).values())
        for b in (0.15, 0.25, 0.35, 0.5, 0.65, 0.8)
    ]
    assert all(b <= a * (1 + 1e-3) + 1e-9 for a, b in zip(totals, totals[1:])), totals


def test_a_phm_budget_sizes_the_terms_layer_by_layer(mixed_bert_dir, calib):
    model, _ = load_model(mixed_bert_dir)
    before = sum(model.get_submodule(n).weight.numel() for n in LINEAR)
    plan = plan_for_budget(model, ["linear"], "0.5", calib, PHMConfig(n=4, fit="aware"))
    terms = {n: cfg.terms for n, cfg in plan.entries}
    assert set(terms) <= set(LINEAR) and len(set(terms.values())) > 1
    assert all(terms[n] == 2 for n in KRON)  # exact at 2 terms: more would buy nothing
    assert any(re.search(r": terms \d+, predicted relative error", note) for note in plan.notes)
    compress_(model, plan, calib, progress=False)
    assert sum(weights(model.get_submodule(n)) for n in LINEAR) <= 0.5 * before


def test_a_table_in_a_mixed_budget_is_offered_the_method_that_takes_it(mixed_bert_dir, calib):
    model, _ = load_model(mixed_bert_dir)
    plan = plan_for_budget(model, ["embeddings", "ffn"], "0.5", calib, both("aware"))
    assert isinstance(dict(plan.entries)["embeddings.word_embeddings"], LowRankConfig)


@pytest.mark.parametrize(
    "targets, configs, error, message",
    [
        (
            ["linear"],
            [LowRankConfig(fit="fisher"), PHMConfig(fit="aware")],
            PlanError,
            "give them the same --fit",
        ),
        (["linear"], [PHMConfig(n=2), PHMConfig(n=4)], PlanError, "one config per method; phm is given 2"),
        (["embeddings"], [TTConfig()], PlanError, "the method tt has no budget rule"),
        (["embeddings"], [PHMConfig()], PlanError, "a phm budget applies to Linear and Conv1D layers; 'embeddings."),
        (["linear"], both("fisher")[:1] + [PHMConfig(n=5)], ShapeError, "n = 5 must divide both dimensions"),
    ],
)
def test_bad_budgets_are_refused(mixed_bert_dir, calib, targets, configs, error, message):
    model, _ = load_model(mixed_bert_dir)
    with pytest.raises(error, match=re.escape(message)):
        plan_for_budget(model, targets, "0.5", calib, configs)


@pytest.mark.parametrize("methods", [["lowrank", "phm"], ["phm"]])
def test_the_command_line_makes_one_plan_over_both_methods(mixed_bert_dir, tmp_path, capsys, methods):
    ckpt = tmp_path / "ckpt"
    argv = ["compress", mixed_bert_dir, "--method", *methods, "--budget", "0.5", "--targets", "linear"]
    assert main([str(a) for a in [*argv, "--calib-passages", 16, "--out", ckpt]]) == 0, capsys.readouterr().err
    meta = json.loads((ckpt / "compressor.json").read_text())
    kinds = {m["type"] for m in meta["modules"].values()}
    assert kinds == ({"LowRankLinear", "PHMLinear"} if len(methods) == 2 else {"PHMLinear"})
    assert meta["plan"]["name"] == f"{'+'.join(methods)}-budget0.5-fisher"
    assert any(note.startswith("layers by method: lowrank") for note in meta["plan"]["notes"]) == (len(methods) == 2)


@pytest.mark.parametrize(
    "options, message",
    [
        (["--method", "lowrank", "phm", "--targets", "linear"], "--method lowrank phm needs --budget"),
        (["--method", "tt", "phm", "--budget", "0.5"], "use it with --method lowrank or phm (or several of them)"),
        (["--method", "lowrank", "phm", "--budget", "0.5", "--terms", "3"], "--budget chooses the terms: leave out"),
        (["--method", "lowrank", "phm", "--budget", "0.5", "--keep", "0.3"], "--budget chooses the ranks: leave out"),
        (["--method", "phm", "--budget", "0.5", "--targets", "embeddings"], "a phm budget applies to Linear and"),
        (["--method", "lowrank", "phm", "--budget", "0.5", "--targets", "ffn", "--n", "5"], "n = 5 must divide"),
        (["--method", "lowrank", "phm", "--budget", "0.5", "--rel-eps", "0.1"], "an option of --method tt, not of"),
    ],
)
def test_bad_input_is_one_sentence_before_any_calibration(
    mixed_bert_dir, tmp_path, capsys, monkeypatch, options, message
):
    def no_calibration(*args, **kwargs):
        raise AssertionError("calibrated before the budget was checked")

    monkeypatch.setattr("converters.pipeline.calibrating.cached_calibration", no_calibration)
    code = main(["compress", str(mixed_bert_dir), *options, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("compressor: error:")]
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["compress", "run"])
@pytest.mark.parametrize(
    "options, message",
    [
        (["--method", "lowrank", "--dense-head", "500", "--keep", "0.25"], "a dense head of 500 rows leaves no tail"),
        (["--method", "lowrank", "--budget", "0.125", "--dense-head", "500"], "a dense head of 500 rows leaves no"),
        (["--method", "tt", "--dense-head", "500"], "a dense head of 500 rows leaves no tail"),
        (["--method", "lowrank", "--budget", "0.05", "--dense-head", "120"], "below the smallest allocation reachable"),
        (["--method", "phm", "--n", "5", "--targets", "ffn"], "n = 5 must divide"),
    ],
)
def test_every_plan_is_checked_before_anything_is_calibrated_or_exported(
    tiny_bert_dir, eval_text_file, tmp_path, capsys, monkeypatch, command, options, message
):
    """The shapes a plan needs (a dense head shorter than the table, a budget that holds every module at
    its smallest size, …) are checked on the loaded model before the original is exported or anything
    calibrated: one sentence, exit status 2, no output folder."""

    def never(what):
        def fail(*args, **kwargs):
            raise AssertionError(f"{what} before every plan was checked")

        return fail

    monkeypatch.setattr("converters.pipeline.calibrating.cached_calibration", never("calibrated"))
    monkeypatch.setattr("converters.pipeline.variants.export_onnx", never("exported"))
    monkeypatch.setattr("converters.pipeline.steps.save_compressed", never("saved"))
    texts = ["--eval-text", str(eval_text_file), "--second-text", "none"] if command == "run" else []
    code = main([command, str(tiny_bert_dir), *options, *texts, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("compressor: error:")]
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert not (tmp_path / "o").exists()


def test_a_table_budget_takes_the_largest_rank_that_fits(mixed_bert_dir, calib):
    """A dense head of 16 rows (16·48) and rank r (r·(132 − 16 + 48)) in 0.4 of the 132×48 table:
    rank 10, where a grid in steps of 8 gave 8."""
    model, _ = load_model(mixed_bert_dir)
    table = model.get_input_embeddings()
    rows, cols = table.weight.shape
    plan = plan_for_budget(
        model, ["embeddings.word_embeddings"], "0.4", calib, LowRankConfig(fit="aware", dense_head=16)
    )
    budget = int(0.4 * rows * cols)
    rank = (budget - 16 * cols) // (rows - 16 + cols)
    assert dict(plan.entries)["embeddings.word_embeddings"].rank == rank == 10
    assert f"budget 0.4: {16 * cols + rank * (rows - 16 + cols):,} of {rows * cols:,}" in plan.notes[0]
