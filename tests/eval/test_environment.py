"""What a report records of the machine and its inputs (eval/environment.py): the integer path read from the CPU's
flags, the hashes that tell two inputs apart."""

import platform

import numpy as np
import pytest

from eval.environment import (
    PAIRS_IN_INT16,
    batches_sha256,
    file_sha256,
    graph_sha256,
    integer_path,
    machine,
    run_record,
    texts_sha256,
)


def _cpuinfo(flags: str) -> str:
    return f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 {flags}\n"


@pytest.mark.parametrize(
    "flags, path",
    [
        ("avx2 fma", "avx2"),  # AMD Zen 2/3, Haswell … Skylake client
        ("avx2 avx512f avx512bw", "avx512"),  # Skylake-SP: AVX-512 without VNNI
        ("avx2 avx512bw avx512_vnni", "avx512_vnni"),  # Cascade Lake, Zen 4/5
        ("avx2 avx_vnni", "avx_vnni"),  # Alder Lake
        ("avx2 avx512bw avx512_vnni amx_int8", "amx"),  # Sapphire Rapids
    ],
)
def test_the_integer_path_is_the_best_instruction_set_the_flags_show(flags, path):
    assert integer_path(_cpuinfo(flags)) == path


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64's CPUID")
def test_the_path_is_the_one_the_process_cpuid_allows(monkeypatch):
    """Under qemu-x86_64 -cpu EPYC-Rome /proc/cpuinfo is still the host's: the CPUID (numpy's reading) decides."""
    import numpy._core._multiarray_umath as umath

    from eval import environment

    monkeypatch.setattr(environment, "_cpuinfo", lambda: _cpuinfo("avx2 avx512bw avx512_vnni avx_vnni amx_int8"))
    monkeypatch.setattr(umath, "__cpu_features__", {**umath.__cpu_features__, "AVX512VNNI": True, "AVX512BW": True})
    assert integer_path() == "amx" and "emulated" not in machine()
    monkeypatch.setattr(umath, "__cpu_features__", {**umath.__cpu_features__, "AVX512VNNI": False, "AVX512BW": False})
    assert integer_path() == "avx2" and machine()["emulated"] == "CPUID shows avx2, /proc/cpuinfo amx"
    monkeypatch.setattr(environment, "_cpuinfo", lambda: _cpuinfo("avx2 avx_vnni"))  # Alder Lake: no AVX-512 at all
    assert integer_path() == "avx_vnni" and "emulated" not in machine()


def test_the_paths_without_vnni_sum_pairs_in_int16():
    assert {"avx2", "avx512"} <= PAIRS_IN_INT16 and not {"avx512_vnni", "avx_vnni", "amx"} & PAIRS_IN_INT16


def test_the_machine_record_names_the_cpu_its_path_and_the_versions():
    record = machine()
    assert record["integer_path"] == integer_path() and record["cpu"]
    assert record["onnxruntime"] and record["torch"] and record["numpy"] == np.__version__


def test_the_hashes_tell_inputs_apart(tmp_path):
    assert texts_sha256(["ab", "c"]) != texts_sha256(["a", "bc"])  # the split is part of the text
    assert texts_sha256(["ab"]) == texts_sha256(["ab"])
    ids = np.arange(6).reshape(2, 3)
    assert batches_sha256([{"input_ids": ids}]) != batches_sha256([{"input_ids": ids + 1}])
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    a.write_bytes(b"graph")
    b.write_bytes(b"graph")
    assert file_sha256(a) == file_sha256(b)
    (tmp_path / "b.onnx.data").write_bytes(b"weights")  # its external data is part of it
    assert file_sha256(a) != file_sha256(b)


def test_the_graph_hash_leaves_the_metadata_out(tmp_path):
    import onnx

    from tests.conftest import matmul_graph

    model = matmul_graph(np.eye(3, dtype=np.float32))
    onnx.save_model(model, str(tmp_path / "a.onnx"))
    onnx.helper.set_model_props(model, {"compressor.parity_max_abs": "1e-6"})  # as one CPU measured it
    onnx.save_model(model, str(tmp_path / "b.onnx"))
    assert file_sha256(tmp_path / "a.onnx") != file_sha256(tmp_path / "b.onnx")
    assert graph_sha256(tmp_path / "a.onnx") == graph_sha256(tmp_path / "b.onnx")
    onnx.save_model(matmul_graph(2 * np.eye(3, dtype=np.float32)), str(tmp_path / "c.onnx"))
    assert graph_sha256(tmp_path / "c.onnx") != graph_sha256(tmp_path / "a.onnx")  # another weight


def test_the_run_record_gives_the_command_as_typed():
    record = run_record(["/x/.venv/bin/compressor", "run", "--out", "runs/demo"])
    assert record["command"] == "compressor run --out runs/demo"
    assert record["date"].endswith("Z")
