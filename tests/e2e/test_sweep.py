"""compressor sweep on a tiny model: every recipe's rows measured in one bench, the Pareto rows
marked, both fronts drawn; a bad recipe file refused in one sentence with nothing written."""

import json

import pytest

from converters.cli import main


def _sweep(capsys, *argv):
    code = main(["sweep", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.plots
def test_sweep_measures_every_recipe_and_draws_the_fronts(tiny_bert_dir, eval_text_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("eval.benchmark.SETTINGS", ((8, 128, 2),))
    recipes = tmp_path / "recipes.json"
    variants = [
        {"name": "small", "method": "tt", "rank": 2, "quantize": ["int8"]},
        {"name": "big", "method": "tt", "rank": 4, "finetune_steps": 2, "quantize": ["fp32", "int8-aware"]},
    ]
    recipes.write_text(json.dumps({"variants": variants}))
    out_dir = tmp_path / "sweep"
    code, out, err = _sweep(
        capsys,
        tiny_bert_dir,
        "--recipes",
        recipes,
        "--data",
        eval_text_file,
        "--eval-text",
        eval_text_file,
        "--second-text",
        eval_text_file,
        "--runs",
        2,
        "--out",
        out_dir,
    )
    assert code == 0, err
    report = json.loads((out_dir / "report.json").read_text())
    names = [v["name"] for v in report["variants"]]
    assert names == [
        "original",
        "original-int8",
        "original-int8-aware",
        "small-int8",
        "big",
        "big-int8-aware",
        "big-ft",
        "big-ft-int8-aware",
    ]
    assert (
        not (out_dir / "small-int8-aware").exists() and (out_dir / "small/onnx/model.onnx").is_file()
    )  # fp32 not measured
    rows = report["variants"]
    assert all(set(v["quality_second_text"]) == set(v["quality"]) for v in rows)
    for axis in ("file_bytes", "latency"):
        assert any(v["pareto"][axis] for v in rows)
    smallest = min(rows, key=lambda v: v["file_bytes"])
    assert smallest["pareto"]["file_bytes"]  # nothing is smaller, so nothing beats it on size
    assert rows[0]["pareto"]["file_bytes"] and rows[0]["quality"]["recall_at_10"] == 1  # none beats its recall
    for png in ("front-size.png", "front-latency.png"):
        assert (out_dir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert str(out_dir / png) in err
    header = next(line for line in (out_dir / "report.md").read_text().splitlines() if line.startswith("| variant"))
    assert "front" in header


def test_a_recipe_of_no_method_rounds_the_original_in_its_own_settings(
    tiny_bert_dir, eval_text_file, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("eval.benchmark.SETTINGS", ((1, 16, 1),))
    recipes = tmp_path / "recipes.json"
    variants = [
        {"name": "small", "method": "tt", "rank": 2, "block_size": 32, "quantize": ["int4-aware"]},
        {"name": "original-3bit", "method": "none", "block_size": 16, "table_bits": 3, "quantize": ["int4-aware"]},
        {"method": "none", "quantize": ["int8-aware"]},
    ]
    recipes.write_text(json.dumps({"variants": variants}))
    out_dir = tmp_path / "sweep"
    texts = ("--calib", eval_text_file, "--eval-text", eval_text_file, "--second-text", "none")
    code, _, err = _sweep(capsys, tiny_bert_dir, "--recipes", recipes, *texts, "--runs", 1, "--out", out_dir)
    assert code == 0, err
    rows = {v["name"]: v.get("quantization", {}) for v in json.loads((out_dir / "report.json").read_text())["variants"]}
    assert list(rows) == [
        "original",
        "original-int8",
        "original-int4-aware",  # the first compressed variant's settings
        "small-int4-aware",
        "original-3bit-int4-aware",  # the recipe's own
        "original-int8-aware",  # a recipe of no method named "original" (by default): the original's own row
    ]
    assert (rows["original-int4-aware"]["block"], rows["original-int4-aware"]["table_bits"]) == (32, 4)
    assert (rows["original-3bit-int4-aware"]["block"], rows["original-3bit-int4-aware"]["table_bits"]) == (16, 3)
    assert not (out_dir / "original-3bit").exists()  # the original's fp32 graph is exported once


@pytest.mark.parametrize(
    "content, message",
    [
        ("[1, 2", "is not JSON"),
        ('{"variants": [{"method": "lowrnk", "rank": 4}]}', "closest is 'lowrank'"),
        ('{"variants": [{"method": "tt", "rnak": 4}]}', "unknown option 'rnak'; the closest is 'rank'"),
        ('{"variants": [{"method": "tt", "rank": 4, "quantize": ["int2"]}]}', "unknown quantization scheme"),
        (
            '{"variants": [{"method": "none", "quantize": ["int8"]}, {"method": "none", "quantize": ["int8"]}]}',
            "two rows are named 'original-int8'",
        ),
    ],
)
def test_a_bad_recipe_file_is_refused_before_anything_runs(content, message, tiny_bert_dir, tmp_path, capsys):
    recipes = tmp_path / "recipes.json"
    recipes.write_text(content)
    code, _, err = _sweep(capsys, tiny_bert_dir, "--recipes", recipes, "--out", tmp_path / "sweep")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipes.json"]
