"""The command line on tiny causal language models: run end to end with the LM metrics, and the
bad input that belongs to language models answered in one sentence."""

import json

import pytest

from tests.conftest import run_cli, write_tiny_lm


def test_run_on_a_tied_lm_compresses_the_table_once_and_reports_perplexity(
    tiny_llama_dir, lm_text, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("eval.benchmark.SETTINGS", ((1, 16, 1), (8, 128, 2)))
    out = tmp_path / "run"
    code, stdout, err = run_cli(
        capsys,
        "run",
        tiny_llama_dir,
        "--method",
        "lowrank",
        "--kind",
        "aware",
        "--dense-head",
        8,
        "--rank",
        4,
        "--calib",
        lm_text,
        "--eval-text",
        lm_text,
        "--second-text",
        lm_text,
        "--finetune-steps",
        3,
        "--data",
        lm_text,
        "--temperature",
        2,
        "--runs",
        2,
        "--out",
        out,
    )
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    rows = {v["name"]: v for v in report["variants"]}
    # an LM's baselines: 4-bit too
    originals = ["original", "original-int8", "original-w8", "original-int4", "original-int4-aware"]
    assert list(rows) == [*originals, "lowrank-head8-r4-aware", "lowrank-head8-r4-aware-ft"]
    assert all(set(row["decode_ms"]) == {"ctx128"} for row in rows.values())  # the tiny LM's context is 160
    assert (out / "original-int4" / "onnx" / "model_q4.onnx").is_file()
    original, compressed = rows["original"], rows["lowrank-head8-r4-aware"]
    assert set(original["quality"]) == {"perplexity", "top1_agreement", "kl_mean"}
    assert original["quality"]["kl_mean"] == 0 and original["quality"]["top1_agreement"] == 1
    assert compressed["quality"]["kl_mean"] > 0 and "quality_second_text" in compressed
    assert compressed["params"] < original["params"]
    assert report["front_quality"] == "top1_agreement" and "validation −KL" in err
    assert rows["lowrank-head8-r4-aware-ft"]["finetune"]["config"]["temperature"] == 2
    assert "| perplexity |" in stdout.replace(" p50 ms", "").replace("perplexity | top1", "perplexity |")


def test_bench_refuses_an_lm_graph_beside_an_encoder(tiny_llama_dir, tiny_bert_dir, tmp_path, capsys):
    for model, path in ((tiny_bert_dir, tmp_path / "enc.onnx"), (tiny_llama_dir, tmp_path / "lm.onnx")):
        assert run_cli(capsys, "export", model, "--out", path)[0] == 0
    code, _, err = run_cli(capsys, "bench", tmp_path / "enc.onnx", tmp_path / "lm.onnx", "--tokenizer", tiny_bert_dir)
    assert code == 2 and "of the causal-lm kind; the original's is of the encoder kind" in err


def test_lm_bad_input_gets_one_clear_sentence(tiny_llama_dir, tiny_bert_dir, tmp_path, capsys):
    ft = ("--temperature", 2, "--finetune-steps", 1)
    code, _, err = run_cli(capsys, "run", tiny_bert_dir, *ft, "--out", tmp_path / "a")
    assert code == 2 and "--temperature is an option of causal-lm models" in err
    head = ("--method", "lowrank", "--targets", "head")
    code, _, err = run_cli(capsys, "compress", tiny_bert_dir, *head, "--out", tmp_path / "b")
    assert code == 2 and "needs an output projection" in err
    code, _, err = run_cli(capsys, "compress", tiny_llama_dir, *head, "--out", tmp_path / "c")
    assert code == 2 and "tied to the input embedding" in err
    small = write_tiny_lm(tmp_path / "small", "llama")
    config = json.loads((small / "config.json").read_text())
    config["vocab_size"] = 40
    (small / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli(capsys, "compress", small, "--out", tmp_path / "d")
    assert code == 2 and "could not load a model from" in err and "beyond the model's table of 40 rows" in err
    assert not any((tmp_path / name).exists() for name in "abcd")


def test_an_lm_run_the_machine_cannot_hold_is_refused_before_any_work(
    tiny_llama_dir, lm_text, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("converters.cli.goals.available_memory", lambda: 2**20)  # 1 MiB available
    code, _, err = run_cli(capsys, "run", tiny_llama_dir, "--calib", lm_text, "--out", tmp_path / "run")
    assert code == 2 and "need about" in err and "0.0 GiB available" in err and "parameters fits here" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_a_corrected_export_says_its_time_and_peak_and_is_refused_where_they_do_not_fit(
    tiny_llama_dir, lm_text, tmp_path, capsys, monkeypatch
):
    from converters.cli.corrected_needs import gram_entries

    config = json.loads((tiny_llama_dir / "config.json").read_text())
    h, i, n = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    assert gram_entries(tiny_llama_dir) == n * (3 * h * h + i * i) + h * h  # each distinct input's K × K
    out = tmp_path / "corrected"
    argv = ("export", tiny_llama_dir, "--quantize", "int4-corrected", "--calib", lm_text, "--out", out)
    monkeypatch.setattr("converters.cli.corrected_needs.available_memory", lambda: 2**20)  # 1 MiB available
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and "int4-corrected on this LM" in err and "0.0 GiB available" in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    monkeypatch.setattr("converters.cli.corrected_needs.available_memory", lambda: 2**40)
    code, _, err = run_cli(capsys, *argv)
    said = next(line for line in err.splitlines() if "int4-corrected: about" in line)
    assert code == 0 and "min on 2 cores and a peak of about" in said and err.index(said) < err.index("wrote")


def test_an_lm_run_of_a_corrected_row_the_machine_cannot_hold_is_refused_before_any_work(
    tiny_llama_dir, lm_text, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("converters.cli.corrected_needs.available_memory", lambda: 2**20)  # 1 MiB available
    argv = ("run", tiny_llama_dir, "--calib", lm_text, "--quantize", "int4-trained", "--out", tmp_path / "run")
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and "int4-trained on this LM" in err and "training's models" in err, err
    assert not (tmp_path / "run").exists()


def test_int4_trained_counts_its_training_and_names_int4_corrected_where_that_fits(tiny_llama_dir, monkeypatch):
    from compressor.errors import CompressorError
    from converters.cli import corrected_needs as needs

    plain, trained = needs.corrected_needs(tiny_llama_dir)[3], needs.corrected_needs(tiny_llama_dir, trains=True)[3]
    assert trained > plain
    monkeypatch.setattr(needs, "available_memory", lambda: (plain + trained) // 2)
    with pytest.raises(CompressorError, match="training's models .* quantize it with int4-corrected, whose peak"):
        needs.check_corrected_fits(tiny_llama_dir, "int4-trained", 240.0)
    assert needs.check_corrected_fits(tiny_llama_dir, "int4-corrected").startswith("int4-corrected: about")


@pytest.mark.parametrize("keep", [False, True])
def test_the_original_is_freed_once_exported_when_no_row_needs_it(tiny_llama_dir, tmp_path, keep):
    import gc
    import weakref

    from converters.checkpoint import load_model
    from converters.pipeline.variants import Variants
    from converters.spec import QuantizeSpec

    model, source = load_model(tiny_llama_dir)
    alive = weakref.ref(model)
    made = Variants(tmp_path / "out", source, model.get_input_embeddings().num_embeddings, None)
    held = [model]
    del model
    made.export_original(held, QuantizeSpec(), keep)  # a run of the original's rows alone: keep False
    gc.collect()
    assert (alive() is not None) == keep and (made.original is not None) == keep
    assert [name for name, _ in made.rows.graphs] == ["original"] and (tmp_path / "out" / "original").is_dir()


def test_an_lm_run_measures_its_w8_and_int4_rows_with_a_shortlist_head_too(lm_text, tmp_path, capsys):
    """`run --shortlist K` on an LM the fused decoder takes: original-w8-short and original-int4-short beside their
    rows, each decoding with K candidates a step; a prompt's pass reads the whole head: its perplexity is its row's."""
    source = write_tiny_lm(tmp_path / "llama", "llama", hidden=64)
    texts = ("--calib", lm_text, "--eval-text", lm_text, "--second-text", "none")
    code, _, err = run_cli(capsys, "run", source, *texts, "--shortlist", 16, "--runs", 1, "--out", tmp_path / "run")
    assert code == 0 and "the best 16 of" not in err and "exactly the 16 best of a rank-32 fit" in err, err
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    rows = {v["name"]: v for v in report["variants"]}
    assert list(rows)[2:6] == ["original-w8", "original-w8-short", "original-int4", "original-int4-short"]
    for base in ("original-w8", "original-int4"):
        short = rows[f"{base}-short"]
        assert short["quantization"]["shortlist"] == 16 and short["quantization"]["rank"] == 32
        ppl, ppl_short = rows[base]["quality"]["perplexity"], short["quality"]["perplexity"]
        assert abs(ppl_short - ppl) <= 1e-4 * ppl and short["decode_ms"]
    code, _, err = run_cli(capsys, "run", source, *texts, "--shortlist", 102, "--out", tmp_path / "big")
    assert code == 2 and "no shorter than this LM's vocabulary of 102" in err and not (tmp_path / "big").exists()
