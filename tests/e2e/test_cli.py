"""The command line end to end on a tiny model, and every bad input answered in one sentence."""

import json
import os
from pathlib import Path

import pytest
import torch

from converters.cli import main
from converters.export import export_embedding_onnx
from tests.conftest import run_cli, write_tiny_bert, write_tiny_lm


def test_compress_export_bench(tiny_bert_dir, eval_text_file, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    code, _, err = run_cli(capsys, "compress", tiny_bert_dir, "--rank", 4, "--out", ckpt)
    assert code == 0, err
    assert json.loads((ckpt / "compressor.json").read_text())["plan"]["entries"][0]["config"]["rank"] == 4
    for model, onnx in ((tiny_bert_dir, tmp_path / "orig.onnx"), (ckpt, tmp_path / "tt.onnx")):
        code, _, err = run_cli(capsys, "export", model, "--out", onnx)
        assert code == 0 and "parity" in err, err
    report = tmp_path / "r" / "report.json"
    code, out, err = run_cli(
        capsys,
        "bench",
        tmp_path / "orig.onnx",
        tmp_path / "tt.onnx",
        "--tokenizer",
        tiny_bert_dir,
        "--eval-text",
        eval_text_file,
        "--runs",
        2,
        "--json",
        report,
    )
    assert code == 0, err
    names = [v["name"] for v in json.loads(report.read_text())["variants"]]
    assert names == ["original", "tt"]
    assert "| tt |" in out


@pytest.mark.plots
def test_run_writes_every_variant_side_by_side(tiny_bert_dir, eval_text_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("eval.benchmark.SETTINGS", ((1, 16, 1),))
    out_dir = tmp_path / "run"
    code, out, err = run_cli(
        capsys,
        "run",
        tiny_bert_dir,
        "--rank",
        2,
        4,
        "--order",
        "none",
        "pca",
        "--eval-text",
        eval_text_file,
        "--runs",
        2,
        "--out",
        out_dir,
    )
    assert code == 0, err
    report = json.loads((out_dir / "report.json").read_text())
    names = [v["name"] for v in report["variants"]]
    assert names == ["original", "original-int8", "tt-r2-none", "tt-r2-pca", "tt-r4-none", "tt-r4-pca"]
    assert all(v["parity_max_abs"] <= 1e-4 for v in report["variants"] if v["name"] != "original-int8")
    int8 = report["variants"][1]
    assert int8["quantization"]["parity_rel_to_fp32"] <= 0.35
    assert int8["file_bytes"] < 0.75 * report["variants"][0]["file_bytes"]
    assert (out_dir / "report.md").is_file() and (out_dir / "tt-r4-pca" / "compressor.json").is_file()
    assert (out_dir / "front-size.png").read_bytes()[:4] == b"\x89PNG" and str(out_dir / "front-size.png") in err
    assert "no front-latency.png" in err  # the (8, 128) setting of its front was not timed
    assert not [p for p in out_dir.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_lowrank_variants_and_budget_from_the_command_line(
    tiny_bert_dir, eval_text_file, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("eval.benchmark.SETTINGS", ((1, 16, 1),))
    calib = tmp_path / "calib.txt"
    calib.write_text(eval_text_file.read_text() * 3)
    out_dir = tmp_path / "run"
    code, _, err = run_cli(
        capsys,
        "run",
        tiny_bert_dir,
        "--method",
        "lowrank",
        "--targets",
        "linear",
        "--kind",
        "fisher",
        "aware",
        "plain",
        "--calib",
        calib,
        "--eval-text",
        eval_text_file,
        "--runs",
        2,
        "--out",
        out_dir,
    )
    assert code == 0, err
    assert "calibration:" in err
    names = [v["name"] for v in json.loads((out_dir / "report.json").read_text())["variants"]]
    assert names == [
        "original",
        "original-int8",
        "lowrank-keep0.5-fisher",
        "lowrank-keep0.5-aware",
        "lowrank-keep0.5-plain",
    ]
    ckpt = tmp_path / "budget"
    code, _, err = run_cli(
        capsys,
        "compress",
        tiny_bert_dir,
        "--method",
        "lowrank",
        "--targets",
        "all",
        "--budget",
        "0.5",
        "--kind",
        "aware",
        "--dense-head",
        8,
        "--calib",
        calib,
        "--out",
        ckpt,
    )
    assert code == 0, err
    meta = json.loads((ckpt / "compressor.json").read_text())
    assert any("predicted relative error" in note for note in meta["plan"]["notes"])
    assert meta["modules"]["embeddings.word_embeddings"]["type"] == "HeadTailEmbedding"
    cache = Path(os.environ["XDG_CACHE_HOME"]) / "compressor"
    cached = sorted(cache.iterdir())
    assert cached and sorted(p.name for p in tmp_path.iterdir()) == ["budget", "calib.txt", "run"]  # none beside --out
    argv = ("compress", tiny_bert_dir, "--method", "lowrank", "--targets", "ffn", "--calib", calib, "--no-cache")
    code, _, err = run_cli(capsys, *argv, "--out", tmp_path / "nocache")
    assert code == 0 and "not cached" in err, err
    assert sorted(cache.iterdir()) == cached


def test_tt_fisher_kind_from_the_command_line(tiny_bert_dir, eval_text_file, tmp_path, capsys):
    calib = tmp_path / "calib.txt"
    calib.write_text(eval_text_file.read_text() * 3)
    ckpt = tmp_path / "ttf"
    argv = ("compress", tiny_bert_dir, "--rank", 4, "--kind", "fisher", "--dense-head", 8, "--calib", calib)
    code, _, err = run_cli(capsys, *argv, "--out", ckpt)
    assert code == 0, err
    config = json.loads((ckpt / "compressor.json").read_text())["plan"]["entries"][0]["config"]
    assert config["fit"] == "fisher"  # --kind, the old spelling of --fit, still taken
    code, _, err = run_cli(capsys, "export", ckpt, "--out", tmp_path / "ttf.onnx")
    assert code == 0 and "parity" in err, err


def test_finetune_command_and_run_with_finetune(tiny_bert_dir, eval_text_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("eval.benchmark.SETTINGS", ((1, 16, 1),))
    ckpt = tmp_path / "ckpt"
    assert run_cli(capsys, "compress", tiny_bert_dir, "--rank", 2, "--out", ckpt)[0] == 0
    code, _, err = run_cli(capsys, "finetune", ckpt, "--steps", 3, "--data", eval_text_file)
    assert code == 0, err
    assert "3 steps" in err and "validation cosine" in err
    assert json.loads((ckpt / "compressor.json").read_text())["finetune"]["steps"] == 3
    state = tmp_path / "ft.state"
    for extra, message in (((), "give its file with --state"), (("--state", state), "no fine-tune state")):
        code, _, err = run_cli(capsys, "finetune", ckpt, "--steps", 3, "--data", eval_text_file, "--resume", *extra)
        assert code == 2 and message in err and not state.exists(), err
    state.write_text("mine")
    code, _, err = run_cli(capsys, "finetune", ckpt, "--steps", 3, "--data", eval_text_file, "--state", state)
    assert code == 2 and "is there: --resume goes on from it" in err and state.read_text() == "mine", err
    code, _, err = run_cli(capsys, "finetune", ckpt, "--steps", 3, "--data", eval_text_file, "--shard")
    assert code == 2 and "launch it with torchrun" in err, err
    if not torch.cuda.is_available():
        code, _, err = run_cli(capsys, "finetune", ckpt, "--steps", 3, "--data", eval_text_file, "--device", "cuda")
        assert code == 2 and "sees no GPU" in err, err
    out_dir = tmp_path / "run"
    code, _, err = run_cli(
        capsys,
        "run",
        tiny_bert_dir,
        "--rank",
        2,
        "--finetune-steps",
        2,
        "--data",
        eval_text_file,
        "--eval-text",
        eval_text_file,
        "--runs",
        2,
        "--out",
        out_dir,
    )
    assert code == 0, err
    variants = json.loads((out_dir / "report.json").read_text())["variants"]
    assert [v["name"] for v in variants] == ["original", "original-int8", "tt-r2-pca", "tt-r2-pca-ft"]
    assert variants[3]["finetune"]["steps"] == 2


def test_finetune_without_its_teacher_says_so(tiny_bert_dir, tmp_path, capsys):
    import shutil

    source = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, source)
    ckpt = tmp_path / "ckpt"
    assert run_cli(capsys, "compress", source, "--rank", 2, "--out", ckpt)[0] == 0
    shutil.rmtree(source)
    code, _, err = run_cli(capsys, "finetune", ckpt, "--steps", 2)
    assert code == 2 and "cannot be found" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["compress", "{tmp}/nowhere", "--out", "{tmp}/o"], "does not exist"),
        (["compress", "{tmp}", "--out", "{tmp}/o"], "is not a model directory"),
        (["compress", "{tiny}", "--rank", "0", "--out", "{tmp}/o"], "rank must be an integer ≥ 1, got 0"),
        (
            ["compress", "{tiny}", "--targets", "encoder.layr.0", "--out", "{tmp}/o"],
            "closest names: encoder.layer.0",
        ),
        (["compress", "{tiny}", "--targets", "pooler.dense", "--out", "{tmp}/o"], "unsupported module"),
        (["compress", "{tiny}", "--rel-eps", "1.5", "--out", "{tmp}/o"], "in (0, 1)"),
        (["compress", "{tiny}", "--plan", "{tmp}/none.json", "--out", "{tmp}/o"], "does not exist"),
        (["bench", "{tmp}/bad.onnx", "--tokenizer", "{tiny}", "--eval-text", "{text}"], "ONNX"),
        (["bench", "{tmp}/bad.onnx", "--target-cpu", "avx2", "--eval-text", "{text}"], "not an ONNX model"),
        (["bench", "{tmp}/bad.onnx", "--target-cpu", "avx3", "--eval-text", "{text}"], "one of native, avx2"),
        (["bench", "{tmp}/lookup.onnx", "--tokenizer", "{tiny}", "--eval-text", "{text}"], "not a graph of a kind"),
        (["bench", "{tmp}/missing.onnx", "--tokenizer", "{tiny}", "--eval-text", "{text}"], "does not exist"),
        (["run", "{tiny}", "--eval-text", "{tmp}/empty.txt", "--out", "{tmp}/o"], "at least 11 are needed"),
        (["run", "{tiny}", "--runs", "0", "--out", "{tmp}/o"], "--runs must be at least 1"),
        (["compress", "{tiny}", "--method", "lowrank", "--budget", "1.5", "--out", "{tmp}/o"], "in (0, 1)"),
        (["compress", "{tiny}", "--budget", "0.5", "--out", "{tmp}/o"], "use it with --method lowrank"),
        (["compress", "{tiny}", "--method", "lowrank", "--budget", "0.5", "--rank", "4", "--out", "{tmp}/o"], "--rank"),
        (["compress", "{tiny}", "--method", "lowrank", "--calib", "{tmp}/empty.txt", "--out", "{tmp}/o"], "at least 1"),
        (["compress", "{tiny}", "--method", "lowrank", "--calib", "{tmp}/short.txt", "--out", "{tmp}/o"], "tokens"),
        (["compress", "{tiny}", "--method", "lowrank", "--keep", "2", "--out", "{tmp}/o"], "in (0, 1)"),
        (["compress", "{tiny}", "--dense-head", "100000", "--out", "{tmp}/o"], "leaves no tail"),
        (["finetune", "{tiny}", "--steps", "2"], "not a compressed checkpoint"),
        (["run", "{tiny}", "--finetune-time", "-1", "--out", "{tmp}/o"], "> 0 seconds"),
        (["run", "{tiny}", "--finetune-time", "30", "--out", "{tmp}/o"], "is the original, only quantized"),
        (["run", "{tiny}", "--quantize", "mixed", "--out", "{tmp}/o"], "from a compressed variant's budget"),
        (
            ["run", "{tiny}", "--rank", "2", "--finetune-steps", "3", "--data", "{tmp}/empty.txt", "--out", "{tmp}/o"],
            "at least 2",
        ),
    ],
)
def test_bad_input_gets_one_clear_sentence(argv, message, tiny_bert_dir, eval_text_file, tmp_path, capsys):
    (tmp_path / "bad.onnx").write_text("this is not onnx")
    export_embedding_onnx(torch.nn.Embedding(10, 4), tmp_path / "lookup.onnx")
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "short.txt").write_text("the value\n")
    fill = {"tmp": tmp_path, "tiny": tiny_bert_dir, "text": eval_text_file}
    code, _, err = run_cli(capsys, *[a.format(**fill) for a in argv])
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("compressor: error:")]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_unknown_method_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["compress", "--method", "zip", "--out", "x"])
    assert stop.value.code == 2
    assert "invalid choice: 'zip'" in capsys.readouterr().err


def test_rank_too_large_is_clamped_and_said(tiny_bert_dir, tmp_path, capsys):
    code, _, err = run_cli(capsys, "compress", tiny_bert_dir, "--rank", 100000, "--out", tmp_path / "o")
    assert code == 0
    assert "warning" in err and "clamped" in err


def test_export_quantized_and_an_unknown_scheme(tiny_bert_dir, tmp_path, capsys):
    from converters.quantization.quantize import is_quantized

    code, _, err = run_cli(capsys, "export", tiny_bert_dir, "--quantize", "int8", "--out", tmp_path / "q.onnx")
    assert code == 0 and "relative error" in err, err
    assert is_quantized(tmp_path / "q.onnx") and sorted(p.name for p in tmp_path.iterdir()) == ["q.onnx"]
    with pytest.raises(SystemExit) as stop:
        main(["export", str(tiny_bert_dir), "--quantize", "int3", "--out", str(tmp_path / "x.onnx")])
    assert stop.value.code == 2 and "invalid choice: 'int3'" in capsys.readouterr().err


def test_export_int4_aware_and_a_bad_block_size(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    import converters.pipeline.exporting as export_command
    from converters.quantization.quantize import is_quantized

    out = tmp_path / "q.onnx"
    code, _, err = run_cli(
        capsys, "export", tiny_bert_dir, "--quantize", "int4-aware", "--block-size", 16, "--out", out
    )
    assert code == 0 and "int4-aware" in err and is_quantized(out), err
    monkeypatch.setattr(export_command, "load_model", lambda *a: pytest.fail("loaded a model for a bad block size"))
    code, _, err = run_cli(
        capsys, "export", tiny_bert_dir, "--quantize", "int4", "--block-size", 24, "--out", tmp_path / "x.onnx"
    )
    assert code == 2 and "power of two, at least 16" in err and err.count("\n") == 1, err
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("command", ["export", "run"])
def test_a_correction_share_outside_0_1_is_refused_before_the_work(
    command, tiny_bert_dir, tmp_path, capsys, monkeypatch
):
    import converters.pipeline.exporting as export_command
    import converters.pipeline.measuring as pipeline

    monkeypatch.setattr(export_command, "load_model", lambda *a: pytest.fail("loaded a model for a bad share"))
    monkeypatch.setattr(pipeline, "resolve_model_dir", lambda *a: pytest.fail("read a model for a bad share"))
    out = tmp_path / ("x.onnx" if command == "export" else "run")
    argv = (command, tiny_bert_dir, "--quantize", "int4-corrected", "--correction-share", 1.5, "--out", out)
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and "--correction-share is a share of the 4-bit bytes in (0, 1), got 1.5" in err, err
    assert err.count("error:") == 1 and "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("command", ["export", "run"])
@pytest.mark.parametrize(
    "asked, message",
    [
        (("w4a8",), "use int4-trained for an LM"),
        (("int4-corrected", "--linear-bits", 3), "--linear-bits 3 is for an encoder's linear layers"),
    ],
)
def test_an_encoder_scheme_on_an_lm_is_refused_before_the_work(command, asked, message, tmp_path, capsys, monkeypatch):
    import converters.pipeline.exporting as export_command
    import converters.pipeline.measuring as pipeline

    lm = write_tiny_lm(tmp_path / "llama")
    capsys.readouterr()  # what writing the LM said
    monkeypatch.setattr(export_command, "quantize_calibration", lambda *a: pytest.fail("calibrated an LM"))
    monkeypatch.setattr(pipeline, "quantize_calibration", lambda *a: pytest.fail("calibrated an LM"))
    out = tmp_path / ("x.onnx" if command == "export" else "run")
    code, _, err = run_cli(capsys, command, lm, "--quantize", *asked, "--out", out)
    assert code == 2 and message in err and err.count("error:") == 1, err
    assert not out.exists()


def test_run_int4_corrected_reports_each_correction(tmp_path, eval_text_file, capsys, monkeypatch):
    monkeypatch.setattr("eval.benchmark.SETTINGS", ((1, 16, 1),))
    wide = write_tiny_bert(tmp_path / "bert", hidden=128, intermediate=256)  # a rank-16 correction pays
    out_dir = tmp_path / "run"
    argv = ("run", wide, "--method", "lowrank", "--targets", "ffn", "--quantize", "int4-corrected")
    common = ("--calib", eval_text_file, "--eval-text", eval_text_file, "--second-text", "none", "--runs", 2)
    code, _, err = run_cli(capsys, *argv, "--correction-share", 0.3, *common, "--out", out_dir)
    assert code == 0, err
    rows = {v["name"]: v for v in json.loads((out_dir / "report.json").read_text())["variants"]}
    corrected = [n for n in rows if n.endswith("-int4-corrected")]
    assert corrected[0] == "original-int4-corrected" and corrected[1].startswith("lowrank-") and len(corrected) == 2
    quantization = rows["original-int4-corrected"]["quantization"]
    assert quantization["correction_share"] == 0.3 and quantization["corrections"]
    for layer in quantization["corrections"].values():
        assert layer["rank"] % 16 == 0 and 0 < layer["rank"] <= 128
        assert layer["rel_output_error"]["factors_rounded"] < layer["rel_output_error"]["rounded"]


def test_export_int4_trained_and_a_bad_correction_time(tmp_path, eval_text_file, capsys, monkeypatch):
    import converters.pipeline.exporting as export_command
    from converters.quantization.quantize import is_quantized

    wide = write_tiny_bert(tmp_path / "bert", hidden=128, intermediate=256)
    out = tmp_path / "t.onnx"
    texts = ("--calib", eval_text_file, "--data", eval_text_file)
    argv = ("export", wide, "--quantize", "int4-trained", "--correction-share", 0.3, "--block-size", 16, *texts)
    code, _, err = run_cli(capsys, *argv, "--correction-time", 3, "--out", out)
    assert code == 0 and is_quantized(out), err
    assert "int4-trained: the corrections trained on" in err and "on 4 passages of text" not in err, err
    monkeypatch.setattr(export_command, "load_model", lambda *a: pytest.fail("loaded a model for a bad time"))
    code, _, err = run_cli(capsys, *argv, "--correction-time", 0, "--out", tmp_path / "x.onnx")
    assert (
        code == 2 and "--correction-time is a time budget in seconds, > 0, got 0" in err and err.count("error:") == 1
    ), err
    assert not (tmp_path / "x.onnx").exists()


def test_run_without_method_options_measures_the_size_goals_recipes(tmp_path, eval_text_file, capsys, monkeypatch):
    from converters.cli.builtin_recipes import SMALL_RECIPE

    monkeypatch.setattr("eval.benchmark.SETTINGS", ((1, 16, 1),))
    wide = write_tiny_bert(tmp_path / "bert", hidden=128, intermediate=256)
    texts = ("--calib", eval_text_file, "--data", eval_text_file, "--eval-text", eval_text_file)
    options = ("--second-text", "none", "--runs", 2, "--correction-time", 2)
    code, _, err = run_cli(capsys, "run", wide, *texts, *options, "--goal", "size", "--out", tmp_path / "run")
    assert code == 0 and "goal size: original-int4-aware, original-table3-int8-aware-table, original-small" in err, err
    rows = {v["name"]: v for v in json.loads((tmp_path / "run" / "report.json").read_text())["variants"]}
    small = f"{SMALL_RECIPE['name']}-w4a8"
    table = "original-table3-int8-aware-table"
    assert list(rows) == ["original", "original-int8", "original-int4-aware", table, small]
    quantization = rows[small]["quantization"]
    assert (quantization["table_head"], quantization["scale_bits"], quantization["table_block"]) == (4096, 8, 128)
    assert (rows["original-int4-aware"]["quantization"]["scale_bits"], quantization["correction_share"]) == (16, 0.005)
    code, _, err = run_cli(capsys, "run", wide, *texts, *options, "--quantize", "int4-aware", "--out", tmp_path / "q")
    assert code == 0 and "no method options: the original in int4-aware" in err, err
    rows = [v["name"] for v in json.loads((tmp_path / "q" / "report.json").read_text())["variants"]]
    assert rows == ["original", "original-int8", "original-int4-aware"]  # the schemes given, on the original


@pytest.mark.parametrize("scheme", ["int4-trained", "w4a8"])
def test_run_a_trained_scheme_makes_a_compressed_variants_row_too(
    scheme, tmp_path, eval_text_file, capsys, monkeypatch
):
    monkeypatch.setattr("eval.benchmark.SETTINGS", ((1, 16, 1),))
    wide = write_tiny_bert(tmp_path / "bert", hidden=128, intermediate=256)
    argv = ("run", wide, "--method", "lowrank", "--targets", "ffn", "--kind", "plain", "--quantize", scheme)
    texts = ("--calib", eval_text_file, "--data", eval_text_file, "--eval-text", eval_text_file)
    options = ("--second-text", "none", "--runs", 2, "--correction-share", 0.3, "--correction-time", 2)
    code, _, err = run_cli(capsys, *argv, *texts, *options, "--out", tmp_path / "run")
    assert code == 0, err
    rows = {v["name"]: v for v in json.loads((tmp_path / "run" / "report.json").read_text())["variants"]}
    names = list(rows)
    assert f"original-{scheme}" in names and f"lowrank-keep0.5-plain-{scheme}" in names  # low-rank FFN factors
    assert f"{scheme} row" not in err  # no row refused
    assert f"original-{scheme}: the corrections trained on" in err  # each training said as its row's
    quantization = rows[f"original-{scheme}"]["quantization"]
    assert quantization["block"] == 32 and "eight_bit_layers" in quantization and quantization["corrections"]
    assert ("int8_layers" in quantization) == (scheme == "w4a8")


def test_each_rows_table_head_is_ranked_by_its_prior(tmp_path, eval_text_file, capsys, monkeypatch):
    """A compressed variant's by its method's (a recipe's freq_prior), the original's by the run's (--freq-prior)."""
    import numpy as np

    from converters.pipeline import variants
    from converters.pipeline.calibrating import token_frequencies

    monkeypatch.setattr("eval.benchmark.SETTINGS", ((1, 16, 1),))
    ranked = []
    head_frequencies = variants.head_frequencies
    monkeypatch.setattr(variants, "head_frequencies", lambda *a: ranked.append(head_frequencies(*a)) or ranked[-1])
    wide = write_tiny_bert(tmp_path / "bert", hidden=128, intermediate=256)
    texts = ("--calib", eval_text_file, "--data", eval_text_file, "--eval-text", eval_text_file)
    options = ("--second-text", "none", "--runs", 2)
    recipe = {"method": "lowrank", "targets": ["ffn"], "fit": "plain", "freq_prior": "none", "table_head": 8}
    (tmp_path / "grid.json").write_text(json.dumps({"variants": [{**recipe, "quantize": ["int4-aware"]}]}))
    grid = ("--recipes", tmp_path / "grid.json")
    code, _, err = run_cli(capsys, "sweep", wide, *grid, *texts, *options, "--out", tmp_path / "s")
    assert code == 0, err
    original, compressed = (c for c in ranked if c is not None)  # original-int4-aware's, then the recipe's row's
    priors = ("wordfreq", "none")
    counts = {p: token_frequencies(eval_text_file, p, 0.5, wide, len(original)).counts.numpy() for p in priors}
    assert not np.array_equal(counts["wordfreq"], counts["none"])
    assert np.array_equal(original, counts["wordfreq"]) and np.array_equal(compressed, counts["none"])
    ranked.clear()
    quantized = ("--quantize", "int4-aware", "--table-head", 8, "--freq-prior", "none")
    code, _, err = run_cli(capsys, "run", wide, *texts, *options, *quantized, "--out", tmp_path / "r")
    assert code == 0, err
    (original,) = (c for c in ranked if c is not None)
    assert np.array_equal(original, counts["none"])


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_a_run_stopped_by_a_signal_leaves_nothing_half_written(tmp_path, capsys, monkeypatch, stop):
    """SIGTERM, how a container stops a run, as Ctrl-C: the row being written goes, nothing under its name."""
    import signal
    import time

    import converters.cli.export as export_command
    from files.atomic import atomic_dir

    def writing(args):
        with atomic_dir(Path(args.out) / "original-int8") as tmp:
            (tmp / "model.onnx").write_bytes(b"half")
            os.kill(os.getpid(), getattr(signal, stop))
            time.sleep(5)  # the signal lands here, in the main thread

    monkeypatch.setattr(export_command, "run", writing)
    interrupting = signal.signal(signal.SIGINT, signal.default_int_handler)  # a command line's own: Ctrl-C raises
    handler = signal.getsignal(signal.SIGTERM)
    try:
        code, _, err = run_cli(capsys, "export", "--out", tmp_path / "out")
    finally:
        signal.signal(signal.SIGINT, interrupting)
    assert code == 130 and "interrupted; outputs not yet complete were not written" in err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
    assert signal.getsignal(signal.SIGTERM) == handler  # put back for whatever runs after main
