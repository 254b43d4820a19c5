"""Faults of the machine, each answered in one sentence before the work or without a trace left:
an unwritable output (a writer that raises EROFS: permissions do not stop root), a disk that
fills up (a writer that raises ENOSPC), too little free space known beforehand."""

import errno
import time
from collections import namedtuple

import pytest

import converters.checkpoint as checkpoint
import converters.export as export
import files.atomic as atomic
from converters.cli import main


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("compressor: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def read_only(*args, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system")


@pytest.mark.parametrize(
    "argv, path",
    [
        (["compress", "{tiny}", "--out", "{tmp}/ro/ckpt"], "{tmp}/ro/ckpt"),
        (["run", "{tiny}", "--out", "{tmp}/ro/run"], "{tmp}/ro/run"),
        (["export", "{tiny}", "--out", "{tmp}/ro/m.onnx"], "{tmp}/ro/m.onnx"),
        (["bench", "{onnx}", "--tokenizer", "{tiny}", "--json", "{tmp}/ro/r.json"], "{tmp}/ro/r.json"),
    ],
)
def test_an_unwritable_output_is_refused_before_the_work(argv, path, tiny_bert_dir, tmp_path, capsys, monkeypatch):
    onnx_path = tmp_path / "m.onnx"
    export.export_onnx(checkpoint.load_model(tiny_bert_dir)[0], onnx_path)
    fill = {"tmp": tmp_path, "tiny": tiny_bert_dir, "onnx": onnx_path}
    monkeypatch.setattr(atomic.tempfile, "mkstemp", read_only)
    start = time.perf_counter()
    code, err = run_cli(capsys, *[a.format(**fill) for a in argv])
    assert code == 2 and time.perf_counter() - start < 5  # before the model is loaded
    line = one_error(err)
    assert path.format(**fill) in line and "Read-only file system" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_an_unwritable_cache_is_refused_with_the_way_out(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache-file"))
    (tmp_path / "cache-file").write_text("a file where the cache folder should be")
    argv = ("compress", tiny_bert_dir, "--method", "lowrank", "--targets", "ffn", "--out", tmp_path / "o")
    code, err = run_cli(capsys, *argv)
    assert code == 2 and "--no-cache" in one_error(err) and not (tmp_path / "o").exists()
    code, err = run_cli(capsys, "compress", tiny_bert_dir, "--rank", 2, "--out", tmp_path / "o")
    assert code == 0, err  # TT-SVD needs no calibration, so no cache


def fill_up(path, *args, **kwargs):
    with open(path, "wb") as f:
        f.write(b"\0" * 1000)
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_disk_that_fills_up_during_a_checkpoint_leaves_nothing(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(checkpoint, "save_safetensors", lambda model, path: fill_up(path))
    code, err = run_cli(capsys, "compress", tiny_bert_dir, "--rank", 2, "--out", tmp_path / "ckpt")
    line = one_error(err)
    assert code == 1 and str(tmp_path / "ckpt") in line
    assert "it needed about" in line and "were written" in line and "free" in line
    assert list(tmp_path.iterdir()) == []  # no temporary, nothing under the final name


def test_a_full_disk_said_by_safetensors_is_out_of_space(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    from safetensors import SafetensorError

    def full(model, path):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpoint, "save_safetensors", full)
    code, err = run_cli(capsys, "compress", tiny_bert_dir, "--rank", 2, "--out", tmp_path / "ckpt")
    assert code == 1 and "the disk filled up" in one_error(err)
    assert list(tmp_path.iterdir()) == []


def test_a_file_where_the_output_folder_goes_is_refused(tiny_bert_dir, tmp_path, capsys):
    (tmp_path / "taken").write_text("a file")
    code, err = run_cli(capsys, "run", tiny_bert_dir, "--out", tmp_path / "taken")
    assert code == 2 and "a file of that name is there" in one_error(err)
    assert (tmp_path / "taken").read_text() == "a file"


def test_a_disk_that_fills_up_during_run_leaves_no_folder(tiny_bert_dir, eval_text_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(export, "save_onnx", lambda proto, path: fill_up(path))  # the original's export, as written
    out = tmp_path / "run"
    code, err = run_cli(capsys, "run", tiny_bert_dir, "--rank", 2, "--eval-text", eval_text_file, "--out", out)
    assert code == 1 and "run/original/onnx/model.onnx" in one_error(err)
    assert not out.exists()


def test_too_little_free_space_is_said_before_writing(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 5000, 5000))
    code, err = run_cli(capsys, "export", tiny_bert_dir, "--out", tmp_path / "m.onnx")
    line = one_error(err)
    assert code == 1 and "needs" in line and "5,000 are free" in line
    assert list(tmp_path.iterdir()) == []


def test_a_cache_that_cannot_be_written_only_costs_a_warning(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    calib = tmp_path / "calib.txt"
    calib.write_text("the value of a list is a string in python\n" * 40)
    monkeypatch.setattr("converters.calibration.save_file", lambda tensors, path, metadata: fill_up(path))
    argv = ("compress", tiny_bert_dir, "--method", "lowrank", "--targets", "ffn", "--kind", "aware", "--calib", calib)
    code, err = run_cli(capsys, *argv, "--out", tmp_path / "o")
    assert code == 0 and "the calibration was not cached" in err, err
    assert (tmp_path / "o" / "compressor.json").is_file()
