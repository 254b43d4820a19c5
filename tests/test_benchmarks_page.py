"""tools/benchmarks_page.py: BENCHMARKS.md and README.md's results table from report.json files, one table per
CPU integer path, the same bytes on every run; and the committed page is what the committed results make."""

import json
from pathlib import Path

import pytest

from tools import benchmarks_page
from tools.benchmarks_page import main

ROOT = Path(__file__).resolve().parent.parent
HEAD = "| variant | file | peak RSS | p50 (1,16) t1 | p50 (8,128) t2 | recall@10 eval / 2nd |"
MB, MIB = 10**6, 2**20


def row(name, file_mb, rss_mib, p50_small, p50_large, recall, recall_2nd, keys=("b1_s16_t1", "b8_s128_t2"), **pareto):
    return {
        "name": name,
        "file_bytes": int(file_mb * MB),
        "peak_rss_bytes": int(rss_mib * MIB),
        "baseline_rss_bytes": 60 * MIB,
        "latency_ms": {keys[0]: {"p50": p50_small, "p90": 2 * p50_small}, keys[1]: {"p50": p50_large, "p90": 0}},
        "quality": {"cosine_mean": 0.99, "recall_at_10": recall},
        "quality_second_text": {"cosine_mean": 0.98, "recall_at_10": recall_2nd},
        "pareto": {"file_bytes": pareto.get("size", False), "latency": pareto.get("p50", False)},
        "sha256": "0" * 64,
    }


def report(path: str, cpu: str, variants: list[dict], environment: bool = True) -> dict:
    out = {"model": "all-MiniLM-L6-v2", "eval_text": "pydoc, 292 passages", "second_text": "news, 300 passages"}
    if environment:
        out["environment"] = {
            "cpu": cpu,
            "integer_path": path,
            "cores": 2,
            "onnxruntime": "1.32.0",
            "torch": "2.13.0+cpu",
            "transformers": "5.24.0",
            "numpy": "2.4.6",
            "python": "3.11.7",
            "texts": {"eval": "a" * 64, "second": "b" * 64},
        }
        out["run"] = {"command": "compressor run --out runs/demo --runs 20", "commit": "abc1234", "date": "2026-12-01"}
    return {**out, "variants": variants}


@pytest.fixture
def results(tmp_path) -> Path:
    """Two reports on two integer paths (one with the latency keys as "(1,16) t1"), a README with the markers."""
    folder = tmp_path / "results"
    folder.mkdir()
    vnni = [
        row("original", 90.9, 189, 4.0, 70.0, 1.0, 1.0, p50=True),
        row("original-int8", 23.2, 150, 2.0, 35.0, 0.95, 0.94, size=True, p50=True),
        row("original-small-w4a8", 11.45, 219, 1.88, 53.9, 0.907, 0.896, size=True),
    ]
    keys = ("(1,16) t1", "(8,128) t2")
    avx2 = [
        row("original", 90.9, 190, 8.0, 165.0, 1.0, 1.0, keys=keys),
        row("original-int4-aware", 14.0, 120, 6.0, 200.0, 0.886, 0.890, keys=keys, size=True),
    ]
    (folder / "b-avx2.json").write_text(json.dumps(report("avx2", "Intel Xeon E5", avx2)))
    (folder / "a-vnni.json").write_text(json.dumps(report("avx512_vnni", "AMD EPYC", vnni), indent=2))
    (tmp_path / "README.md").write_text("# x\n\nabove\n<!-- results -->\nold table\n<!-- /results -->\nbelow\n")
    return folder


def generate(folder: Path, *extra) -> int:
    return main(["--results", str(folder), "--page", str(folder.parent / "B.md"), *map(str, extra)])


def tables(page: str) -> dict[str, list[str]]:
    """Each integer path's section: its lines."""
    sections = page.split("\n## Integer path ")[1:]
    return {s.split("`")[1]: s.split("\n## ")[0].splitlines() for s in sections}


def test_one_table_per_integer_path_with_ratios_to_the_original(results):
    readme = results.parent / "README.md"
    assert generate(results, "--readme", readme) == 0
    page = (results.parent / "B.md").read_text()
    assert page.count("\n") <= 300 and page.startswith("# Benchmarks\n")
    by_path = tables(page)
    assert list(by_path) == ["avx512_vnni", "avx2"]  # best path first, whatever the files' names
    vnni, avx2 = by_path["avx512_vnni"], by_path["avx2"]
    assert vnni.count(HEAD) == 1 and avx2.count(HEAD) == 1
    for section, cpu in ((vnni, "AMD EPYC"), (avx2, "Intel Xeon E5")):
        text = "\n".join(section)
        assert f"- CPU: {cpu}, 2 cores" in text and "ONNX Runtime 1.32.0" in text
        assert "`compressor run --out runs/demo --runs 20`" in text and "`abc1234`; date: 2026-12-01" in text
    assert "| `original` (p50) | 90.90 MB (1.000×) | 189 MiB (1.00×) | 4.00 ms (1.00×) | 70.00 ms (1.00×) |" in vnni[-3]
    small = "| `original-small-w4a8` (size) | 11.45 MB (0.126×) | 219 MiB (1.16×) | 1.88 ms (0.47×) | 53.90 ms (0.77×) "
    assert vnni[-1] == small + "| 0.907 / 0.896 |"
    assert avx2[-1].startswith("| `original-int4-aware` (size) | 14.00 MB (0.154×) | 120 MiB (0.63×) | 6.00 ms (0.75×)")
    assert "original-small-w4a8" not in "\n".join(avx2)  # each report's rows in its own path's table
    top = page.split("\n## Integer path")[0]
    assert "`original-small-w4a8` 0.126× (0.907 / 0.896), `original-int8` 0.255× (0.950 / 0.940)" in top
    assert "docs/lab-notes/" in page
    text = readme.read_text()
    assert text.startswith("# x\n\nabove\n<!-- results -->\nall-MiniLM-L6-v2 on AMD EPYC") and text.endswith(
        "| 0.907 / 0.896 |\n<!-- /results -->\nbelow\n"
    )
    assert HEAD in text and "old table" not in text and "avx2" not in text.split("<!-- results -->")[1].split("\n")[0]


def test_the_same_bytes_on_a_second_run_and_check(results):
    readme = results.parent / "README.md"
    assert generate(results, "--readme", readme) == 0
    first = (results.parent / "B.md").read_bytes(), readme.read_bytes()
    assert generate(results, "--readme", readme) == 0
    assert ((results.parent / "B.md").read_bytes(), readme.read_bytes()) == first
    assert generate(results, "--readme", readme, "--check") == 0
    (results / "c.json").write_text(json.dumps(report("avx2", "Intel Xeon E5", [row("original", 1, 1, 1, 1, 1, 1)])))
    assert generate(results, "--readme", readme, "--check") == 1  # a new result: the pages are stale
    assert ((results.parent / "B.md").read_bytes(), readme.read_bytes()) == first  # --check writes nothing


def test_a_report_without_its_environment_or_second_text_says_unknown(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    old = report("", "", [row("original", 1, 80, 1, 10, 1, 1), row("x", 0.5, 80, 2, 5, 0.9, 0.8)], environment=False)
    del old["second_text"], old["variants"][1]["quality_second_text"], old["variants"][1]["latency_ms"]
    (folder / "old.json").write_text(json.dumps(old))
    assert generate(folder, "--no-readme") == 0
    section = tables((tmp_path / "B.md").read_text())["unknown"]
    assert "- CPU: unknown; integer path `unknown`" in section and "- command: `unknown`" in section
    assert section[-1] == "| `x` | 0.50 MB (0.500×) | 80 MiB (1.00×) | – | – | 0.900 / – |"


def test_a_page_over_300_lines_is_refused(tmp_path, capsys):
    folder = tmp_path / "results"
    folder.mkdir()
    rows = [row(f"v{i}", 1, 80, 1, 10, 1, 1) for i in range(10)]
    for i in range(20):
        (folder / f"r{i:02}.json").write_text(json.dumps(report("avx2", "cpu", rows)))
    assert generate(folder, "--no-readme") == 1
    assert "over 300" in capsys.readouterr().err and not (tmp_path / "B.md").exists()


def test_the_committed_page_is_what_the_committed_results_make():
    results = ROOT / "benchmarks" / "results"
    if not list(results.glob("*.json")):
        pytest.skip(
            "no report.json committed under benchmarks/results/ yet: the page has nothing to be checked against"
        )
    assert benchmarks_page.main(["--check"]) == 0, "run `make benchmarks-page` and commit BENCHMARKS.md and README.md"


def test_an_lm_report_gives_its_time_per_token_and_the_stages_of_its_run():
    rows = [row("original", 540, 980, 0, 0, 1.0, 1.0), row("original-int4", 78, 489, 0, 0, 0.6, 0.5)]
    for one, steps in zip(rows, ((10.0, 11.0), (4.0, 5.5))):
        del one["latency_ms"]
        one["decode_ms"] = {f"ctx{c}": {"per_token_p50_ms": ms} for c, ms in zip((512, 128), reversed(steps))}
    lm = report("avx512_vnni", "AMD EPYC", rows)
    lm["run"]["stages"] = {
        "stages": [
            {"stage": "original: export", "seconds": 4.9, "peak_rss_bytes": 3 * 2**30},
            {"stage": "bench", "seconds": 211.4, "peak_rss_bytes": 4 * 2**30},
        ],
        "seconds": 216.3,
        "peak_rss_bytes": 4 * 2**30,
    }
    page = "\n".join(benchmarks_page.heading("lm.json", lm) + benchmarks_page.table(lm))
    assert "| variant | file | peak RSS | ms/token 128 ctx | ms/token 512 ctx | recall@10 eval / 2nd |" in page
    assert "| `original-int4` | 78.00 MB (0.144×) | 489 MiB (0.50×) | 4.00 ms (0.40×) | 5.50 ms (0.50×) |" in page
    assert "original: export 5 s, 3.00 GiB; bench 211 s, 4.00 GiB; the run 216 s, peak 4.00 GiB" in page


def test_the_lm_runs_at_scale_are_a_table_of_their_own(tmp_path):
    assert benchmarks_page.scale_section(tmp_path / "scale") == ""  # none measured: no section
    (tmp_path / "scale").mkdir()
    run = {
        "command": "python benchmarks/large_models.py lms --out runs/large",
        "commit": "abc1234",
        "date": "2026-11-29",
        "environment": {"cpu": "AMD EPYC", "integer_path": "avx512_vnni", "onnxruntime": "1.32.0"},
    }
    ran = {
        **run,
        "exit": 0,
        "seconds": 1762.2,
        "said": ["compressor: … about 24 minutes on 2 cores and a peak of at most 16.0 GiB …"],
        "estimate": {"minutes": 24, "peak_gib": 16.0},
    }
    ran["stages"] = {"stages": [{"stage": "bench", "seconds": 672.1, "peak_rss_bytes": 2**30}], "peak_rss_bytes": 2**30}
    ran["rows"] = {"original": {"file_bytes": 2**28}}
    refused = {**run, "exit": 2, "seconds": 3.4, "said": ["compressor: error: … need about 40.0 GiB at their peak …"]}
    refused["estimate"] = {"minutes": 60, "peak_gib": 40.0}  # a refused run said its peak alone
    (tmp_path / "scale" / "lms.json").write_text(json.dumps({"small": ran, "large": refused}))
    corrected = {**run, "seconds": 156.3, "peak_gib": 2.79, "said": ["compressor: int4-corrected: reworded"]}
    corrected["estimate"] = {"minutes": 4, "peak_gib": 2.5}  # the figures, not the sentence the command said
    (tmp_path / "scale" / "corrected.json").write_text(json.dumps({"small: int4-corrected": corrected}))
    section = benchmarks_page.scale_section(tmp_path / "scale")
    assert (
        "| small: int4-corrected | AMD EPYC, `avx512_vnni`, 1.32.0 | 4 min / 2.5 GiB | 2.6 min | 2.79 GiB | – |"
        in section
    )
    assert (
        "| small | AMD EPYC, `avx512_vnni`, 1.32.0 | 24 min / 16.0 GiB | 29.4 min | 1.00 GiB (4.0× the fp32 graph) "
        "| bench 672, 1.00 |" in section
    )
    assert "large: `python benchmarks/large_models.py lms --out runs/large`, commit `abc1234`" in section
    assert "| large | AMD EPYC, `avx512_vnni`, 1.32.0 | 40.0 GiB | refused (exit 2) | – | – |" in section
    tables = [block for block in section.split("\n\n") if block.startswith("|")]
    assert len(tables) == 2  # a table each file, each under its own header (not the first file's caption's rows)
    assert all(block.splitlines()[0].startswith("| model |") for block in tables)


def test_the_decode_records_are_tables_with_genais_ratio_and_the_drafts_passes(tmp_path):
    assert benchmarks_page.decode_section(tmp_path / "decode") == ""  # none measured: no section
    (tmp_path / "decode").mkdir()
    timing = {"prefill_ms": 90.0, "per_token_p50_ms": 4.0, "per_token_p90_ms": 4.5, "tokens_per_s": 250.0}
    record = {
        "run": {"command": "python benchmarks/lm_against_genai.py --ours a b", "commit": "abc1234", "date": "2026"},
        "environment": {"cpu": "AMD EPYC", "integer_path": "avx512_vnni", "onnxruntime": "1.32.0"},
        "greedy": {"b+draft:lookup": {"first": {"identical": "0/8"}, "verifier": {"identical": "3/8"}}},
        "decode": {
            "b": {"ctx128": timing},
            "b+draft:lookup": {
                "ctx128": {
                    **timing,
                    "tokens_per_s": 500.0,
                    "tokens_per_pass": 2.75,
                    "acceptance": 0.9,
                    "round_mean_ms": [1.8, 2.2, 2.0],
                }
            },
            "genai:g": {"ctx128": {**timing, "tokens_per_s": 200.0, "round_mean_ms": [6.0, 4.4, 5.0]}},
        },
        "peak_rss_gib": 3.5,
    }
    (tmp_path / "decode" / "smollm2.json").write_text(json.dumps(record))
    section = benchmarks_page.decode_section(tmp_path / "decode")
    assert "| b | 4.00 (4.00), 0.80× GenAI | – |" in section
    # each round's ratio beside the means': 1.8 / 6.0, 2.2 / 4.4, 2.0 / 5.0 (a record without rounds: none said)
    said = "| b+draft:lookup | 2.00 (4.00), 0.40× GenAI (rounds 0.30–0.50×); 2.75 tokens a pass, acceptance 0.90 |"
    assert said in section
    assert "0/8 as the first row's; 3/8 as its verifier's own" in section
    assert "`avx512_vnni`, ONNX Runtime 1.32.0" in section
