"""The memory a run needs, said before the work: a model too big for the memory left is refused from its
safetensors headers, statistics too big for it are refused before the pass, and the default fit (fisher)
gives way to aware when only its output sensitivities are what does not fit."""

import json

from converters.calibration import statistics_bytes
from converters.checkpoint import load_model
from converters.pipeline import steps
from tests.conftest import run_cli

LINEAR = ("--method", "lowrank", "--targets", "linear", "--keep", "0.5")


def _bytes(tiny_bert_dir, sensitivity: bool) -> int:
    model, _ = load_model(tiny_bert_dir)
    names = [n for n, m in model.named_modules() if type(m).__name__ == "Linear" and n.startswith("encoder.")]
    return statistics_bytes(model, names, sensitivity)


def test_a_model_bigger_than_the_memory_left_is_refused_before_loading(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("converters.loading.available_memory", lambda: 1000)
    code, _, err = run_cli(capsys, "compress", tiny_bert_dir, "--rank", 4, "--out", tmp_path / "out")
    assert code == 2 and "does not fit in memory" in err and "parameters" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_the_default_fit_gives_way_to_aware_where_the_sensitivities_do_not_fit(
    tiny_bert_dir, eval_text_file, tmp_path, capsys, monkeypatch
):
    aware, fisher = _bytes(tiny_bert_dir, False), _bytes(tiny_bert_dir, True)
    monkeypatch.setattr(steps, "available_memory", lambda: (aware + fisher) // 2)
    argv = ("compress", tiny_bert_dir, *LINEAR, "--calib", eval_text_file, "--no-cache", "--out", tmp_path / "light")
    code, _, err = run_cli(capsys, *argv)
    assert code == 0 and "fitted with --fit aware" in err, err
    assert "calibration: about" in err and "with output sensitivities" not in err
    entries = json.loads((tmp_path / "light" / "compressor.json").read_text())["plan"]["entries"]
    assert {e["config"]["fit"] for e in entries} == {"aware"}


def test_a_fit_asked_for_by_name_is_refused_where_its_statistics_do_not_fit(
    tiny_bert_dir, eval_text_file, tmp_path, capsys, monkeypatch
):
    aware, fisher = _bytes(tiny_bert_dir, False), _bytes(tiny_bert_dir, True)
    monkeypatch.setattr("converters.pipeline.calibrating.available_memory", lambda: (aware + fisher) // 2)
    argv = ("compress", tiny_bert_dir, *LINEAR, "--kind", "fisher", "--calib", eval_text_file, "--no-cache")
    code, _, err = run_cli(capsys, *argv, "--out", tmp_path / "heavy")
    assert code == 2 and "--fit aware" in err and "GiB are available" in err, err
    assert not (tmp_path / "heavy").exists()


def test_a_damaged_weights_file_is_left_to_the_loader_to_name(tiny_bert_dir, tmp_path, capsys):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_bert_dir, broken)
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    code, _, err = run_cli(capsys, "compress", broken, "--rank", 4, "--out", tmp_path / "out")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
