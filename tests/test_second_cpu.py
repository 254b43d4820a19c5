"""benchmarks/second_cpu.py: the integer path a copied folder is benched on, an emulator's said as such, and its
figures written in a report.json's shape that tools/benchmarks_page.py reads (no time or memory: "–")."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


second_cpu = _module("second_cpu", ROOT / "benchmarks" / "second_cpu.py")
page = _module("benchmarks_page", ROOT / "tools" / "benchmarks_page.py")


def test_the_path_is_the_best_the_flags_show_and_the_cpuid_allows():
    flags = ["avx512_vnni", "avx_vnni", "avx512bw", "avx2"]
    assert second_cpu._integer_path(flags, ["AVX2", "AVX512BW", "AVX512VNNI"]) == "avx512_vnni"
    assert second_cpu._integer_path(flags, ["AVX2"]) == "avx2"  # qemu-x86_64 -cpu EPYC-Rome on that host
    assert second_cpu._integer_path(["amx_int8", "avx512_vnni", "avx2"], ["AVX2", "AVX512VNNI"]) == "amx"


def test_an_emulated_recall_only_bench_is_a_report_the_page_reads(tmp_path):
    meta = {"model": "all-MiniLM-L6-v2", "eval_text": "pydoc", "second_text": "news", "original_bytes": 90_000_000}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    env = {"cpu": "AMD EPYC", "integer_path": "avx2", "emulated": "CPUID shows avx2, /proc/cpuinfo avx512_vnni"}
    rows = {"original-int8-aware.avx2": {"file_bytes": 23_000_000, "recall_at_10": 0.93, "recall_at_10_second": 0.94}}
    report = second_cpu._report(tmp_path, env, rows)
    assert [v["name"] for v in report["variants"]] == ["original", "original-int8-aware.avx2"]
    (result := tmp_path / "results").mkdir()
    (result / "minilm-avx2.json").write_text(json.dumps(report))
    text = page.make_page(page.load_reports(result))
    assert "## Integer path `avx2`" in text and "- emulated (CPUID shows avx2" in text
    assert "| `original-int8-aware.avx2` | 23.00 MB (0.256×) | – | – | – | 0.930 / 0.940 |" in text
