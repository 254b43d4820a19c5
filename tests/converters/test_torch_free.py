"""A run's torch-free stage (converters/pipeline/torch_free.py, rows_manifest.py, rows.py): a run of an LM's
original rows alone writes its rows manifest once the original is exported and rounds the rows and benches them in
a process that imports neither PyTorch nor transformers: a child of `main([...])` in Python, the shell command's own
process (converters/cli/shell.py) from the shell, the same stage from the same manifest; the manifest round-trips, a bad
one gets one sentence and exit status 2, and the child's status and output are the caller's. The scheme registry
still lists every scheme, and the package faces load their names on first use."""

import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

import compressor
from converters.cli import main
from converters.pipeline.child import HAND_OVER
from converters.pipeline.ending import StageEnded, ended
from converters.pipeline.rows import LEFT_BEHIND, Rows
from converters.pipeline.rows_manifest import MANIFEST, Pending, read_manifest, write_manifest
from converters.pipeline.torch_free import round_and_bench
from converters.quantization.registry import SchemeConfig, schemes
from eval.benchmark import BenchInputs

ROOT = Path(__file__).resolve().parents[2]
LIGHT = (
    "converters.cli.shell",
    "converters.pipeline.torch_free",
    "converters.pipeline.rows_manifest",
    "converters.quantization.schemes.int8",
    "converters.quantization.schemes.int4",
    "converters.quantization.schemes.int4_aware",
    "converters.quantization.kv_cache",
    "eval.benchmark",
)


def _imported(code: str) -> list[str]:
    """The lines `code` prints in a fresh Python."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def _stage(*argv) -> subprocess.CompletedProcess:
    """`python -m converters.pipeline.torch_free ARGV…`, as a user would type it."""
    argv = [sys.executable, "-m", "converters.pipeline.torch_free", *map(str, argv)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_the_rows_and_the_bench_import_no_torch_or_transformers():
    code = f"import sys\nfor m in {LIGHT!r}: __import__(m)\n"
    code += "print(*[m for m in ('torch', 'transformers') if m in sys.modules], 'checked')"
    assert _imported(code) == ["checked"]


def test_the_shell_s_command_waits_for_its_child_without_numpy_or_onnx_runtime():
    code = "import sys\nimport converters.cli.shell\n"
    code += "print(*[m for m in ('numpy', 'onnxruntime', 'torch') if m in sys.modules], 'checked')"
    assert _imported(code) == ["checked"]


def test_the_registry_still_lists_every_scheme_and_one_scheme_s_module_imports_it_alone():
    code = "import pkgutil, sys\nimport converters.quantization.schemes.int4_aware\n"
    code += "from converters.quantization import registry, schemes\nalone = sorted(registry._SCHEMES)\n"
    code += "modules = list(pkgutil.iter_modules(schemes.__path__))\n"
    code += "print(*alone, 'torch' in sys.modules, len(registry.schemes()), len(modules))"
    *alone, light, every, modules = _imported(code)
    assert alone == ["int4", "int4-aware"] and light == "False"  # int4-aware and the int4 it derives from
    assert every == modules  # a scheme a module


def test_a_scheme_config_rebuilt_from_its_json_imports_its_own_module_alone():
    config = schemes()["int4-aware"](block_size=64, table_head=16)
    code = "import json, sys\nfrom converters.quantization.registry import SchemeConfig\n"
    code += f"config = SchemeConfig.from_dict(json.loads({json.dumps(json.dumps(config.to_dict()))}))\n"
    code += "print(config.scheme, config.block_size, config.table_head, 'torch' in sys.modules)"
    assert _imported(code) == ["int4-aware", "64", "16", "False"]


def test_a_package_face_loads_its_names_on_first_use_and_refuses_others():
    assert compressor.tt_matrix_svd.__module__ == "compressor.tt"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        compressor.nothing  # noqa: B018


def test_every_scheme_config_round_trips_through_json_and_a_foreign_one_is_refused():
    for config in schemes().values():
        made = config()
        assert SchemeConfig.from_dict(json.loads(json.dumps(made.to_dict()))) == made
        assert {f.name for f in fields(made) if f.init} <= set(made.to_dict())
    with pytest.raises(compressor.errors.CompressorError, match="names a scheme its module registers"):
        SchemeConfig.from_dict({**schemes()["int8"]().to_dict(), "module": "converters.quantization.schemes.int4"})
    with pytest.raises(compressor.errors.CompressorError, match="int8 takes the options"):
        SchemeConfig.from_dict({**schemes()["int8"]().to_dict(), "bits": 3})


def test_the_manifest_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    feeds = [{"input_ids": rng.integers(0, 50, (2, 7)), "attention_mask": np.ones((2, 7), np.int64)} for _ in range(2)]
    rows = Rows(tmp_path, tmp_path / "model", 50, feeds, "int8")
    rows.claim("original")
    rows.add_graph("original", tmp_path / "original" / "model.onnx", {})
    with rows.stages.stage("original: export"):
        pass
    aware = schemes()["int4-aware"](table_head=8)
    pending = Pending(
        "original", tmp_path / "original" / "model.onnx", (aware,), {"int4-aware": rng.integers(0, 9, 50)}
    )
    inputs = BenchInputs({"quality": feeds[:1]}, 50, rng.integers(0, 50, 30))
    bench = dict(model_name="m", runs=2, goal=None, texts=(["a b"], "x.txt"), second=(None, None), hashes={"c": "0"})
    path = write_manifest(rows, pending, {**bench, "inputs": inputs, "argv": ["compressor", "run"]})
    assert path == tmp_path / MANIFEST and sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST, "rows-manifest.npz"]
    back, todo, said = read_manifest(path)
    assert back.state() == rows.state() and back.after == "original: export" and rows.after is None
    assert all((a[k] == b[k]).all() for a, b in zip(back.batches, feeds) for k in a) and len(back.batches) == 2
    assert todo.name == "original" and todo.graph == pending.graph and todo.schemes == pending.schemes
    assert (todo.head_counts["int4-aware"] == pending.head_counts["int4-aware"]).all()
    assert said.pop("inputs").vocab == 50 and said.pop("argv") == ["compressor", "run"]
    assert said == {**bench, "texts": [["a b"], "x.txt"], "second": [None, None]}  # tuples read back as lists


@pytest.mark.parametrize("given", ["missing", "not-json", "other-json", "two-arguments"])
def test_a_bad_manifest_gets_one_sentence_and_exit_status_2(given, tmp_path):
    path = tmp_path / MANIFEST
    if given == "not-json":
        path.write_text("{")
        path.with_suffix(".npz").write_bytes(b"")
    if given == "other-json":
        path.write_text(json.dumps({"manifest": "something else"}))
        np.savez(path.with_suffix(".npz"), x=np.zeros(1))
    done = _stage(path, path) if given == "two-arguments" else _stage(path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("compressor: error: ") and not done.stdout


def test_a_run_told_to_hand_over_names_its_manifest_and_starts_no_child(tmp_path, monkeypatch):
    handed = tmp_path / "handed"
    monkeypatch.setenv(HAND_OVER, str(handed))
    round_and_bench(tmp_path / "nothing.json")  # no manifest there: a child would end with status 2
    assert handed.read_text(encoding="utf-8") == str(tmp_path / "nothing.json")


def test_the_shell_command_runs_the_stage_its_child_hands_over_and_nothing_more(tmp_path, monkeypatch):
    from converters.cli import shell
    from converters.pipeline import torch_free

    started, staged = [], []

    def child(argv, stage, env):  # the torch part of the run, handing over (or not) as round_and_bench does
        started.append(argv[2:])
        if "--hand" in argv:
            Path(env[HAND_OVER]).write_text(str(tmp_path / MANIFEST), encoding="utf-8")

    monkeypatch.setattr(shell, "run_child", child)
    monkeypatch.setattr(torch_free, "stage", staged.append)
    shell._run(["run", "m", "--hand"])
    shell._run(["run", "m"])
    assert started == [["run", "m", "--hand"], ["run", "m"]] and staged == [tmp_path / MANIFEST]


def test_the_child_s_exit_status_and_output_are_the_caller_s(tmp_path, capsys):
    with pytest.raises(StageEnded) as ended_with:
        round_and_bench(tmp_path / "nothing.json")
    assert ended_with.value.exit_code == 2 and ended_with.value.said
    err = capsys.readouterr().err  # relayed to this process's sys.stderr
    assert err.count("\n") == 1 and "is no rows manifest of a run" in err
    assert ended(lambda: round_and_bench(tmp_path / "nothing.json")) == 2
    assert capsys.readouterr().err.count("\n") == 1  # said once, by the child


def _rows(report: dict) -> list[tuple]:
    """What a report's rows are, whichever road made them: name, width, parameters, scheme and its fields."""
    return [(v["name"], v.get("width"), v["params"], sorted(v.get("quantization", {}))) for v in report["variants"]]


@pytest.fixture(scope="module")
def roads(tiny_llama_dir, lm_text, tmp_path_factory) -> dict:
    """The LM goal's run on the tiny Llama both ways, once for this file's tests: `main([...])` in this process
    ("python": its exit status, stdout, stderr, out folder, report) and `compressor run` from the shell ("shell")."""
    tmp = tmp_path_factory.mktemp("roads")
    texts = ("--calib", lm_text, "--eval-text", lm_text, "--second-text", "none", "--runs", 1)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main([str(a) for a in ("run", tiny_llama_dir, *texts, "--out", tmp / "python")])
    shell = [Path(sys.executable).parent / "compressor", "run", tiny_llama_dir, *texts, "--out", tmp / "shell"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(list(map(str, shell)), capture_output=True, text=True, timeout=600, env=env, cwd=tmp)
    found = {"python": (code, stdout.getvalue(), stderr.getvalue())}
    found["shell"] = (done.returncode, done.stdout, done.stderr)
    for road, (code, out, err) in found.items():
        assert code == 0, err[-2000:]
        report = json.loads((tmp / road / "report.json").read_text())
        found[road] = {"out": out, "err": err, "folder": tmp / road, "report": report}
    return found


def test_main_from_python_and_compressor_run_from_the_shell_take_the_same_road(roads, tiny_llama_dir):
    python, shell = roads["python"]["report"], roads["shell"]["report"]
    assert _rows(python) == _rows(shell) and [v[0] for v in _rows(python)][:2] == ["original", "original-int8"]
    stages = [[s["stage"] for s in r["run"]["stages"]["stages"]] for r in (python, shell)]
    assert stages[0] == stages[1] == ["original: export", *[v[0] for v in _rows(python)][1:], "bench"]
    for report in (python, shell):  # the child's sys.modules, at the end of its bench
        assert report["run"]["torch_free"] == {"after": "original: export", "imported": [], "of": list(LEFT_BEHIND)}
    err, stdout = roads["python"]["err"], roads["python"]["out"]
    assert "original-int8: " in err and "| original-int8 |" in stdout  # the child's output, relayed to sys.std*
    assert "| original-int8 |" in roads["shell"]["out"] and roads["shell"]["err"].count("wrote ") >= 3
    command, out = shell["run"]["command"], roads["shell"]["folder"]  # the run's, not the child's
    assert command.startswith(f"compressor run {tiny_llama_dir} ") and command.endswith(f"--out {out}")


def test_an_lm_s_goal_measures_the_original_s_rows_each_stage_said_as_it_ends(roads):
    err, report = roads["python"]["err"], roads["python"]["report"]
    assert "goal balanced is an encoder's" in err  # its rows (w4a8, narrow tables) refuse an LM
    assert "minutes here and a peak of" in err and "the pace the record was timed at" in err  # said before the work
    rows = [v["name"] for v in report["variants"]]
    assert rows == ["original", "original-int8", "original-w8", "original-int4", "original-int4-aware"]
    assert not any("latency_ms" in v for v in report["variants"])  # an LM is timed by its decode, not encoder shapes
    assert all("decode_ms" in v for v in report["variants"])
    assert all(v["quantization"]["parity_rel_to_fp32"] < 0.5 for v in report["variants"][1:])  # rounded, not broken
    stages = report["run"]["stages"]
    assert all(s["seconds"] >= 0 and s["peak_rss_bytes"] > 0 for s in stages["stages"])
    assert stages["peak_rss_bytes"] == max(s["peak_rss_bytes"] for s in stages["stages"])
    assert all(f"{s['stage']}: " in err for s in stages["stages"])  # each said as it ends
    assert not any(list(roads[road]["folder"].glob(".*.tmp")) for road in roads)  # nothing half-written left
