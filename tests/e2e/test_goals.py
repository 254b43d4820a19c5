"""The front door of `compressor run`: a goal measures its rows on the user's model and names the row to deploy,
a built-in recipe or a recipe file runs instead, `compressor recipes` lists them, the help lists at most 25
options while the expert ones are still taken, and a goal, recipe or recipe file that is not there is refused in
one sentence before any work."""

import json

import numpy as np
import pytest

from converters.cli import build_parser
from converters.cli.catalog import builtin_recipes
from converters.cli.goals import GOALS
from tests.conftest import run_cli, write_tiny_lm


def test_a_goal_runs_its_rows_and_names_the_row_to_deploy(tiny_bert_dir, eval_text_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("eval.benchmark.SETTINGS", ((1, 16, 1), (8, 128, 2)))
    out = tmp_path / "run"
    code, _, err = run_cli(
        capsys, "run", tiny_bert_dir, "--goal", "latency", "--eval-text", eval_text_file, "--runs", 2, "--out", out
    )
    assert code == 0, err
    assert "goal latency: original-int8-aware beside original-int8" in err
    report = json.loads((out / "report.json").read_text())
    assert [v["name"] for v in report["variants"]] == ["original", "original-int8", "original-int8-aware"]
    choice = report["choice"]
    assert choice["goal"] == "latency" and choice["row"] in ("original-int8", "original-int8-aware")
    assert (
        f"deploy {choice['row']}" in err
        and f"**deploy {choice['row']}** (goal latency" in (out / "report.md").read_text()
    )


def test_a_recipe_by_name_or_file_runs_instead(tiny_bert_dir, eval_text_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("eval.benchmark.SETTINGS", ((1, 16, 1),))
    recipe = tmp_path / "mine.json"
    recipe.write_text(
        json.dumps({"variants": [{"name": "narrow", "method": "none", "quantize": ["int8-aware-table"]}]})
    )
    for given, row in (("original-table4", "original-table4-int8-aware-table"), (recipe, "narrow-int8-aware-table")):
        out = tmp_path / str(row)
        code, _, err = run_cli(
            capsys, "run", tiny_bert_dir, "--recipe", given, "--eval-text", eval_text_file, "--runs", 1, "--out", out
        )
        assert code == 0, err
        names = [v["name"] for v in json.loads((out / "report.json").read_text())["variants"]]
        assert names == ["original", "original-int8", row]


def test_a_goal_or_recipe_not_there_is_refused(tiny_bert_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["run", "--goal", "smallest"])
    assert stopped.value.code == 2 and "invalid choice: 'smallest' (choose from 'balanced'" in capsys.readouterr().err
    code, _, err = run_cli(capsys, "run", tiny_bert_dir, "--recipe", "nosuch", "--out", tmp_path / "x")
    assert code == 2 and "--recipe is a built-in recipe (original-table3, original-table4," in err
    code, _, err = run_cli(
        capsys, "run", tiny_bert_dir, "--recipe", "original-table3", "--rank", 8, "--out", tmp_path / "x"
    )
    assert code == 2 and "give one or the other" in err
    assert not (tmp_path / "x").exists()


def test_a_recipe_file_with_an_unknown_key_or_for_another_kind_is_refused(tiny_bert_dir, tmp_path, capsys):
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"variants": [{"method": "none", "quantize": ["int8"], "tabel_bits": 3}]}))
    code, _, err = run_cli(capsys, "run", tiny_bert_dir, "--recipe", typo, "--out", tmp_path / "x")
    assert code == 2 and "table_bits" in err  # the closest key
    lm = write_tiny_lm(tmp_path / "lm")
    code, _, err = run_cli(capsys, "run", lm, "--recipe", "original-table3", "--out", tmp_path / "y")
    assert code == 2 and "is not for this model" in err and not (tmp_path / "y").exists()


def test_the_help_lists_at_most_25_options_and_the_others_are_still_taken(capsys):
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--help"])
    shown = [line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith("-")]
    assert len(shown) <= 25
    args = parser.parse_args(["run", "--table-head", "512", "--correction-share", "0.1"])  # hidden, still taken
    assert (args.table_head, args.correction_share) == (512, 0.1)


def test_recipes_lists_every_recipe_and_goal(capsys):
    code, out, _ = run_cli(capsys, "recipes")
    assert code == 0
    assert all(name in out for name in builtin_recipes()) and all(f"  {goal} " in out for goal in GOALS)


def test_the_time_said_before_a_run_follows_the_models_size_and_the_cpus_pace(tmp_path, monkeypatch):
    """A goal's minutes: the record's run on MiniLM times the weights' bytes over MiniLM's (not below 1×) times this
    CPU's pace over the record's; an LM run's: a row's time on the line through the record's LM runs, times its rows
    (a shortlist head adds two), at the pace now."""
    from converters.cli import goals

    runs = [r for r in goals._records(goals.GOAL_RECORDS) if r["name"] == GOALS["balanced"].estimate]
    pace = np.mean([r["pace_s"] for r in runs])
    seconds = np.mean([r["seconds"] / r["pace_s"] for r in runs]) * 2 * pace  # the records' runs at twice their pace
    monkeypatch.setattr(goals, "_pace", lambda: 2 * pace)  # a CPU at half the records' pace
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.truncate(5 * runs[0]["weight_bytes"])  # sparse: a 110M model's bytes, none written
    minutes, said = goals.goal_minutes("balanced", tmp_path)
    assert minutes == round(5 * seconds / 60) and "0.50× the pace" in said
    (tmp_path / "model.safetensors").unlink()
    assert goals.goal_minutes("balanced", tmp_path)[0] == max(1, round(seconds / 60))  # MiniLM's at least
    lms = goals._lm_runs()
    assert lms
    assert goals.lm_rows(None) == 5 and goals.lm_rows((4096, 128)) == 7  # the original, int8, w8, int4, int4-aware
    for lm in lms:  # the line at each run's own pace gives back its seconds (one or two runs: exactly; more: near)
        monkeypatch.setattr(goals, "_pace", lambda lm=lm: lm["pace_s"])
        monkeypatch.setattr(goals, "stored_parameters", lambda _, lm=lm: lm["params"])
        shortlist = None if len(lm["rows"]) == goals.lm_rows(None) else (4096, 128)
        params, minutes, peak = goals.lm_run_needs(tmp_path, shortlist)
        assert abs(minutes - lm["seconds"] / 60) <= 0.35 * lm["seconds"] / 60 + 1 and peak >= lm["peak_bytes"]
    monkeypatch.setattr(goals, "stored_parameters", lambda _: 10**10)  # minutes enough that rounding is small
    alone, with_shortlist = (goals.lm_run_needs(tmp_path, s)[1] for s in (None, (4096, 128)))
    assert abs(with_shortlist / alone - 7 / 5) < 0.01


def test_the_time_said_reads_the_runs_of_this_cpus_integer_path_where_there_are_any(monkeypatch):
    """Timed runs of this CPU's integer path alone where the records hold one (integer kernels without VNNI run
    slower than the float pace says), every run where they hold none; the peak reads every run on any CPU."""
    from converters.cli import goals

    records = goals._records.__wrapped__
    every = records(goals.GOAL_RECORDS)
    paths = {r["environment"]["integer_path"] for r in every}
    for path in paths:
        monkeypatch.setattr(goals, "integer_path", lambda path=path: path)
        assert {r["environment"]["integer_path"] for r in records(goals.GOAL_RECORDS)} == {path}
        assert {r["environment"]["integer_path"] for r in records(goals.GOAL_RECORDS, paced=False)} == paths
    monkeypatch.setattr(goals, "integer_path", lambda: "a CPU no record was timed on")
    assert len(records(goals.GOAL_RECORDS)) == len(every)


def test_the_peak_said_before_an_lm_run_counts_the_waiting_process_of_its_own_road(monkeypatch):
    """From the shell the command's process waits without PyTorch (converters/cli/shell.py); from Python the caller
    waits holding it: each road's share read from its own record."""
    from converters.cli import goals
    from converters.pipeline.child import HAND_OVER

    record = json.loads(goals.WAITING_RECORD.read_text(encoding="utf-8"))
    for road, handed_over in (("child_process", False), ("handed_over", True)):
        run = record[road]
        assert goals.waiting_bytes(handed_over) == max(round((run["tree_peak_gib"] - run["stage_peak_gib"]) * 2**30), 0)
    assert goals.waiting_bytes(False) > goals.waiting_bytes(True)
    monkeypatch.setenv(HAND_OVER, "somewhere")
    assert goals.waiting_bytes() == goals.waiting_bytes(True)
    monkeypatch.delenv(HAND_OVER)
    assert goals.waiting_bytes() == goals.waiting_bytes(False)


def test_the_largest_lm_said_to_fit_is_not_refused(monkeypatch, tmp_path):
    """The peak an LM run is refused by holds what its process holds beside its stages (the record's processes
    together less its stages' peak), and the largest model the refusal says fits is not refused: the sentence and
    the check read one bound."""
    import re

    from compressor.errors import CompressorError
    from converters.cli import goals

    record = json.loads(goals.WAITING_RECORD.read_text(encoding="utf-8"))["child_process"]
    assert goals.waiting_bytes() == round((record["tree_peak_gib"] - record["stage_peak_gib"]) * 2**30) > 0
    monkeypatch.setattr(goals, "_pace", lambda: 0.1)
    monkeypatch.setattr(goals, "available_memory", lambda: 20 * 2**30)
    monkeypatch.setattr(goals, "stored_parameters", lambda _: 50 * 10**9)
    with pytest.raises(CompressorError) as refused:
        goals.check_lm_run_fits(tmp_path, ("int8",), None)
    fits = float(re.search(r"up to ([0-9.]+)B parameters fits here", str(refused.value)).group(1)) * 1e9
    monkeypatch.setattr(goals, "stored_parameters", lambda _: int(0.98 * fits))
    assert "peak of at most" in goals.check_lm_run_fits(tmp_path, ("int8",), None)
    monkeypatch.setattr(goals, "stored_parameters", lambda _: int(1.02 * fits))
    with pytest.raises(CompressorError):
        goals.check_lm_run_fits(tmp_path, ("int8",), None)
