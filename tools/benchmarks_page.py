"""BENCHMARKS.md, and the results table between README.md's `<!-- results -->` markers, from the report.json
files committed under benchmarks/results/. Run: `make benchmarks-page` (or .venv/bin/python tools/benchmarks_page.py;
`--check` says whether the committed pages are what the results make, and writes nothing).

The page is byte for byte what the results make: the files are read in order of name, every figure is formatted
at a fixed width, and nothing of the moment (no date, no path of this machine) goes in. A report is one
`compressor run` / `sweep` / `bench` report.json (docs/texts-and-measuring.md) copied as it is: "model", "eval_text",
"second_text", "variants" (each with "name", "file_bytes", "peak_rss_bytes", "latency_ms", "quality",
"quality_second_text", "pareto"), and the blocks that say what it ran on, "environment" (the CPU, its integer path,
the library versions: eval/environment.py) and "run" (command, commit, date). A block or figure a report lacks is
said as "unknown" or "–"; it stops nothing. Standard library only, so that it runs anywhere the repository is."""

import argparse
import json
import os
import re
import sys
from pathlib import Path

__all__ = ["main", "make_page", "readme_block", "rewrite_readme", "load_reports", "scale_section"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "BENCHMARKS.md"
README = ROOT / "README.md"
MAX_LINES = 300
# The two latency columns: (batch, sequence, intra-op threads)
SETTINGS = ((1, 16, 1), (8, 128, 2))
# The integer paths in eval/environment.py's order, best first; any other name after them, "unknown" last
PATH_ORDER = ("amx", "avx512_vnni", "avx_vnni", "avx512", "avx2", "arm64_dot", "arm64", "sse")
UNKNOWN = "unknown"
# Each Pareto front of a row's "pareto" (eval/pareto.py) by the name report.md gives it
FRONT_NAMES = {"file_bytes": "size", "latency": "p50", "memory": "RSS"}
QUALITY_NAMES = {"recall_at_10": "recall@10", "top1_agreement": "top-1 agreement", "perplexity": "perplexity"}
# README.md's block: `<!-- results -->` (the first report of the page) or `<!-- results: NAME.json -->`, then
# the closing marker; everything between them is the script's
README_OPEN = re.compile(r"^<!-- results(?::\s*(?P<file>[^ ]+?))?\s*-->$", re.MULTILINE)
README_CLOSE = "<!-- /results -->"
LATENCY_KEY = re.compile(r"^b(\d+)_s(\d+)_t(\d+)$|^\((\d+),(\d+)\)t(\d+)$")  # b8_s128_t2 or "(8,128) t2"
MIB = 2**20


def load_reports(results: Path) -> list[tuple[str, dict]]:
    """(file name, report) of every *.json under `results`, in order of name; none when the folder is not there."""
    if not results.is_dir():
        return []
    reports = []
    for path in sorted(results.glob("*.json"), key=lambda p: p.name):
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SystemExit(f"benchmarks_page: {path.name} is not JSON ({e}); each result is a report.json") from None
        if not isinstance(report, dict) or not isinstance(report.get("variants"), list) or not report["variants"]:
            raise SystemExit(f"benchmarks_page: {path.name} has no list of variants; each result is a report.json")
        reports.append((path.name, report))
    return reports


def _block(report: dict, name: str) -> dict:
    block = report.get(name)
    return block if isinstance(block, dict) else {}


def _said(value) -> str:
    return UNKNOWN if value in (None, "") else str(value)


def integer_path(report: dict) -> str:
    return _said(_block(report, "environment").get("integer_path"))


def _path_rank(path: str) -> tuple:
    if path in PATH_ORDER:
        return (0, PATH_ORDER.index(path), path)
    return (2, 0, path) if path == UNKNOWN else (1, 0, path)


def _latency(row: dict, setting: tuple[int, int, int]) -> float | None:
    """The p50 in ms of `setting` in a row's latency_ms, whichever way its keys are written."""
    for key, figures in (row.get("latency_ms") or {}).items():
        match = LATENCY_KEY.match(key.replace(" ", ""))
        if match and tuple(int(g) for g in match.groups() if g is not None) == setting and isinstance(figures, dict):
            return figures.get("p50")
    return None


def _original(report: dict) -> dict:
    """The row the ratios are to: the one named original, else the first (the reference of a bench)."""
    return next((v for v in report["variants"] if v.get("name") == "original"), report["variants"][0])


def quality_metric(report: dict) -> str:
    """recall@10 where the rows have it (an encoder), else the report's front quality, else the first there is."""
    metrics = [m for v in report["variants"] for m in (v.get("quality") or {})]
    if "recall_at_10" in metrics:
        return "recall_at_10"
    front = report.get("front_quality")
    return front if front in metrics else (metrics[0] if metrics else "recall_at_10")


def _ratio(value, base, digits: int) -> str:
    return f" ({value / base:.{digits}f}×)" if value is not None and base else ""


def _file(row: dict, base: dict) -> str:
    size = row.get("file_bytes")
    if size is None:
        return "–"
    return f"{size / 1e6:.2f} MB" + _ratio(size, base.get("file_bytes"), 3)


def _rss(row: dict, base: dict) -> str:
    rss = row.get("peak_rss_bytes")
    return "–" if rss is None else f"{rss / MIB:.0f} MiB" + _ratio(rss, base.get("peak_rss_bytes"), 2)


def _p50(row: dict, base: dict, setting) -> str:
    p50 = _latency(row, setting)
    return "–" if p50 is None else f"{p50:.2f} ms" + _ratio(p50, _latency(base, setting), 2)


def _quality(row: dict, metric: str) -> str:
    figures = [(row.get(key) or {}).get(metric) for key in ("quality", "quality_second_text")]
    return " / ".join("–" if f is None else f"{f:.3f}" for f in figures)


def _fronts(row: dict) -> list[str]:
    return [FRONT_NAMES.get(cost, cost) for cost, on in sorted((row.get("pareto") or {}).items()) if on is True]


def _setting_label(setting) -> str:
    batch, seq, threads = setting
    return f"({batch},{seq}) t{threads}"


def _per_token(row: dict, base: dict, context: str) -> str:
    step = ((row.get("decode_ms") or {}).get(context) or {}).get("per_token_p50_ms")
    base_step = ((base.get("decode_ms") or {}).get(context) or {}).get("per_token_p50_ms")
    return "–" if step is None else f"{step:.2f} ms" + _ratio(step, base_step, 2)


def table(report: dict) -> list[str]:
    """The fixed-column table of one report: a row per variant, each figure with its ratio to the original's; an
    LM's report (its rows timed per generated token) its decode time at each context instead of the p50s."""
    base, metric = _original(report), quality_metric(report)
    contexts = sorted({c for v in report["variants"] for c in (v.get("decode_ms") or {})}, key=lambda c: int(c[3:]))
    times = [f"ms/token {c[3:]} ctx" for c in contexts] or [f"p50 {_setting_label(s)}" for s in SETTINGS]
    head = ["variant", "file", "peak RSS", *times, f"{QUALITY_NAMES.get(metric, metric)} eval / 2nd"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in report["variants"]:
        fronts = _fronts(row)
        marks = [*fronts, *(["off its gate"] if row.get("gate_failed") else [])]
        name = f"`{row.get('name', '?')}`" + (f" ({', '.join(marks)})" if marks else "")
        timed = [_per_token(row, base, c) for c in contexts] or [_p50(row, base, s) for s in SETTINGS]
        lines.append("| " + " | ".join([name, _file(row, base), _rss(row, base), *timed, _quality(row, metric)]) + " |")
    return lines


def _stages(run: dict) -> list[str]:
    """The run's stages (converters/pipeline/stages.py), each with its time and peak RSS, when it recorded them."""
    stages = run.get("stages")
    if not isinstance(stages, dict) or not stages.get("stages"):
        return []
    each = "; ".join(
        f"{s['stage']} {s['seconds']:.0f} s, {s['peak_rss_bytes'] / 2**30:.2f} GiB" for s in stages["stages"]
    )
    whole = f"{stages['seconds']:.0f} s, peak {stages['peak_rss_bytes'] / 2**30:.2f} GiB"
    return [f"- stages (time, peak RSS): {each}; the run {whole}"]


def heading(file: str, report: dict) -> list[str]:
    """What a table's figures were measured on and by: CPU, integer path, versions, command, commit, date."""
    env, run = _block(report, "environment"), _block(report, "run")
    cores = f", {env['cores']} cores" if env.get("cores") else ""
    versions = ", ".join(
        f"{label} {_said(env.get(key))}"
        for label, key in (("torch", "torch"), ("transformers", "transformers"), ("Python", "python"))
    )
    lines = [
        f"- CPU: {_said(env.get('cpu'))}{cores}; integer path `{integer_path(report)}`",
        f"- ONNX Runtime {_said(env.get('onnxruntime'))}; {versions}",
        f"- command: `{_said(run.get('command'))}`",
        f"- commit: `{_said(run.get('commit'))}`; date: {_said(run.get('date'))}",
        f"- quality on: {_said(report.get('eval_text'))}; 2nd: {_said(report.get('second_text'))}",
        *_stages(run),
    ]
    if env.get("emulated"):
        lines.append(
            f"- emulated ({env['emulated']}): the integer path's own kernels, under qemu-x86_64; time and memory "
            "there are the emulator's, so none are given"
        )
    if _original(report).get("name") != "original":
        lines.append(f"- ratios to the first row, `{_original(report).get('name')}` (no row is named original)")
    choice = report.get("choice")
    if choice:
        lines.append(f"- **deploy `{choice['row']}`** (goal {choice['goal']}, {choice['rule']}): {choice['why']}")
    return [f"### {_said(report.get('model'))} (`benchmarks/results/{file}`)", "", *lines]


def _front_line(report: dict, cost: str, what: str) -> str | None:
    """The rows but the original on one front, cheapest first, each with its ratio and quality."""
    base, metric = _original(report), quality_metric(report)
    costs = {
        "file_bytes": lambda v: v.get("file_bytes"),
        "latency": lambda v: _latency(v, SETTINGS[-1]),
        "memory": lambda v: v.get("peak_rss_bytes"),
    }[cost]
    on = [v for v in report["variants"] if v is not base and (v.get("pareto") or {}).get(cost) is True]
    on = [v for v in on if costs(v) is not None]
    if not on or not costs(base):
        return None
    items = [
        f"`{v.get('name')}` {costs(v) / costs(base):.3f}× ({_quality(v, metric)})"
        for v in sorted(on, key=lambda v: (costs(v), v.get("name", "")))
    ]
    return f"{what}: " + ", ".join(items)


def standing(file: str, report: dict) -> list[str]:
    """A report's lines at the top of the page: where it ran, and its rows on each front, cheapest first."""
    env, metric = _block(report, "environment"), quality_metric(report)
    emulated = ", emulated" if env.get("emulated") else ""
    lines = [
        f"- **{_said(report.get('model'))}** on {_said(env.get('cpu'))} (`{integer_path(report)}`{emulated}), "
        f"`{_said(_block(report, 'run').get('command'))}`; {QUALITY_NAMES.get(metric, metric)} eval / 2nd in brackets:"
    ]
    fronts = (
        ("file_bytes", "smallest file for its quality (size front), as a share of the original's"),
        ("latency", f"fastest for its quality at p50 {_setting_label(SETTINGS[-1])} (p50 front)"),
        ("memory", "least peak RSS for its quality (RSS front)"),
    )
    said = [line for cost, what in fronts if (line := _front_line(report, cost, what))]
    rows = ", ".join(
        f"`{v.get('name')}` ({_quality(v, metric)})" for v in report["variants"] if v.get("name") != "original"
    )
    lines += [f"  - {line}" for line in said] or [f"  - no fronts marked (quality alone): {rows}"]
    return lines


INTRO = """\
# Benchmarks

<!-- Written by tools/benchmarks_page.py from benchmarks/results/*.json (`make benchmarks-page`); do not edit. -->

Where the toolkit stands today, measured: one table per CPU integer path (the instructions ONNX Runtime's
int8 kernels multiply with: `avx512_vnni` and `amx` add each product into int32, `avx2` pairs them in int16
first), each headed with the CPU, the versions, and the command, commit and date that made it. Every figure
of a row has its ratio to the `original` row of the same report in brackets. Rows on a Pareto front of the
report are marked after their name (size: file bytes, p50: latency at (8,128) on 2 threads, RSS: peak memory;
each against the quality column). This page is generated from the report.json files under
`benchmarks/results/` by `make benchmarks-page`; the history of how each figure was reached, and what was
tried and not kept, is in [docs/lab-notes/](docs/lab-notes/).
"""

HOW = """\
## Why the paths differ

Without VNNI (`avx2`, `avx512`) ONNX Runtime sums two u8 × s8 products in int16 before int32, which saturates
past 32,767 unless the weights keep to 7 bits. Graphs written for a VNNI CPU (8-bit weights) lose recall
there: int8-aware's smoothing fills more of the activations' range, so it loses most (MiniLM 0.942 → 0.914 on
the eval text; 0.916 measured on a real AVX2 CPU), the one-line int8 a little (0.906 → 0.904, 0.904
measured there). `--target-cpu avx2` (the default on such a CPU) keeps them to 7 bits, and they hold (0.935,
0.924 for the 3-bit table). The `avx2` figures are of ONNX Runtime's own AVX2 kernels under QEMU's emulator
(recall only); how that was checked against the hardware's is in
[docs/lab-notes/2026-11-28-deployment.md](docs/lab-notes/2026-11-28-deployment.md).

## How the figures are taken

- file: the ONNX graph's bytes (with its external data). peak RSS: a fresh process that loads the graph and
  runs one (8, 128) batch. p50: ONNX Runtime on the CPU, `ORT_ENABLE_ALL`, the graphs taking turns, at
  (batch, sequence) on 1 or 2 intra-op threads, on the eval text's own tokens.
- quality: recall@10 of the mean-pooled embeddings against the original's (an encoder; a causal LM's
  column is its top-1 agreement) on the eval text and on a second, unlike text.
- The method and scheme pages in [docs/](docs/README.md) say what each row is; `compressor run --help`
  the options.

## Adding a result

Copy a run's report.json as it is to `benchmarks/results/NAME.json` (small JSON; the one kind of generated
file committed, so that this page can be checked against it), run `make benchmarks-page`, and commit the
three together: the result, this page and README.md's table. The test `tests/test_benchmarks_page.py`
fails while they disagree.

## History

[docs/lab-notes/benchmarks-history.md](docs/lab-notes/benchmarks-history.md) holds every measurement
before this page was generated (4,022 lines by issue and day, each figure with its command), and
[docs/lab-notes/readme-history.md](docs/lab-notes/readme-history.md) the README's measured prose of then.
"""


# what a run said before its work: its minutes and peak, or the peak that refused it
ESTIMATE = r"about ([\d.]+ min(?:utes)?).*?peak of (?:at most |about )?([\d.]+ GiB)|needs? about ([\d.]+ GiB)"


def scale_section(folder: Path) -> str:
    """The LM runs at scale (`python benchmarks/large_models.py lms`: benchmarks/results/scale/*.json, model name →
    {"command", "commit", "date", "exit", "seconds", "said", "stages", "environment"}), one line each; "" without."""
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not files:
        return ""
    lines = [
        "## LMs at scale",
        "",
        "`compressor run MODEL` on an LM (its original's rows), and `compressor export MODEL --quantize "
        "int4-corrected` or `int4-trained` (rows named so), each in a process of its own:",
        "",
    ]
    for file in files:  # a table each, its header first: a second file's rows are not the first's caption's
        if file is not files[0]:
            lines.append("")
        lines += ["| model | CPU, integer path, ONNX Runtime | said before | took | peak RSS | stages (s, GiB) |"]
        lines += ["|---|---|---|---|---|---|"]
        for name, run in json.loads(file.read_text(encoding="utf-8")).items():
            env = run.get("environment") or {}
            machine = f"{_said(env.get('cpu'))}, `{_said(env.get('integer_path'))}`, {_said(env.get('onnxruntime'))}"
            said = next(iter(run.get("said") or []), "")
            estimate = re.search(ESTIMATE, said)
            before = " / ".join(g for g in (estimate.groups() if estimate else ()) if g) or "–"
            stages = run.get("stages") or {}
            peak = f"{stages['peak_rss_bytes'] / 2**30:.2f} GiB" if stages else "–"
            peak = f"{run['peak_gib']:.2f} GiB" if "peak_gib" in run else peak  # one process's own, from wait4
            fp32 = ((run.get("rows") or {}).get("original") or {}).get("file_bytes")
            peak += f" ({stages['peak_rss_bytes'] / fp32:.1f}× the fp32 graph)" if stages and fp32 else ""
            code = run.get("exit", 0)
            took = f"{run['seconds'] / 60:.1f} min" if code == 0 else f"refused (exit {code})"
            took = f"killed after {run['seconds'] / 60:.1f} min (signal {-code})" if code < 0 else took
            each = "; ".join(
                f"{s['stage']} {s['seconds']:.0f}, {s['peak_rss_bytes'] / 2**30:.2f}" for s in stages.get("stages", [])
            )
            lines.append(f"| {name} | {machine} | {before} | {took} | {peak} | {each or '–'} |")
        runs = json.loads(file.read_text(encoding="utf-8"))
        each = "; ".join(
            f"{name}: `{_said(run.get('command'))}`, commit `{_said(run.get('commit'))}`, {_said(run.get('date'))}"
            for name, run in runs.items()
        )
        lines += ["", f"(`benchmarks/results/scale/{file.name}`: {each})"]
    return "\n".join(lines) + "\n"


def _ms(timing: dict) -> str:
    """A row's time per generated token at one context: the mean (every token's share of the run) and the p50."""
    return f"{1e3 / timing['tokens_per_s']:.2f} ({timing['per_token_p50_ms']:.2f})"


# what a record's greedy tokens were compared with
AGAINST = {"first": "the first row's", "fp32": "the fp32 graph's", "verifier": "its verifier's own"}


def _decode_lines(file: Path, result: dict) -> list[str]:
    """One decode record (benchmarks/lm_against_genai.py's or benchmarks/lm_kv_cache.py's --json) as a table."""
    env, run = result.get("environment") or {}, result.get("run") or {}
    decode = result["decode"]
    contexts = sorted({c for row in decode.values() for c in row}, key=lambda c: int(c[3:]))
    genai = next((row for name, row in decode.items() if name.startswith("genai:")), None)
    head = "| graph | " + " | ".join(f"ms/token {c[3:]}" for c in contexts) + " | greedy, or perplexity |"
    lines = [head, "|---|" + "---|" * (len(contexts) + 1)]
    for name, row in decode.items():
        cells = []
        for c in contexts:
            timing = row.get(c)
            if timing is None:
                cells.append("–")
                continue
            cell = _ms(timing)
            if genai is not None and not name.startswith("genai:") and c in genai:
                cell += f", {genai[c]['tokens_per_s'] / timing['tokens_per_s']:.2f}× GenAI"
                rounds = [o / g for o, g in zip(timing.get("round_mean_ms", []), genai[c].get("round_mean_ms", []))]
                if rounds:  # the rounds took turns: each one's ratio
                    cell += f" (rounds {min(rounds):.2f}–{max(rounds):.2f}×)"
            if "tokens_per_pass" in timing:
                cell += f"; {timing['tokens_per_pass']:.2f} tokens a pass, acceptance {timing['acceptance']:.2f}"
            if "cache_mb_read_per_token" in timing:
                cell += f"; cache {timing['cache_mb_read_per_token']:.1f} MB"
            cells.append(cell)
        greedy = (result.get("greedy") or {}).get(name) or {}
        said = "; ".join(f"{v['identical']} as {AGAINST.get(k, k)}" for k, v in greedy.items())
        quality = [q[name] for q in (result.get("quality") or {}).values() if name in q]
        said = said or ", ".join(f"ppl {q['perplexity']:.2f}, top-1 {q['top1_agreement']:.3f}" for q in quality)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {said or '–'} |")
    texts = "; ".join(f"{split}: {q['text']}" for split, q in (result.get("quality") or {}).items())
    lines += [
        "",
        f"(`benchmarks/results/decode/{file.name}`: `{_said(run.get('command'))}`, commit `{_said(run.get('commit'))}`,"
        f" {_said(run.get('date'))}; {_said(env.get('cpu'))}, `{_said(env.get('integer_path'))}`, ONNX Runtime "
        f"{_said(env.get('onnxruntime'))}"
        + (f"; peak RSS of the process {result['peak_rss_gib']} GiB" if "peak_rss_gib" in result else "")
        + (f"; perplexity as a decoder reads {texts}" if texts else "")
        + ")",
    ]
    return lines


def decode_section(folder: Path) -> str:
    """The decode records (benchmarks/results/decode/*.json), a table each; "" without."""
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not files:
        return ""
    lines = [
        "## Decoding",
        "",
        "Time per generated token at batch 1, 2 threads, the graphs taking turns: the mean over every token (a",
        "speculative row's passes shared among the tokens they yield) and, in brackets, the p50; the ratio to GenAI's",
        "mean, and where the record keeps them the least and most of its rounds' ratios (each round's means, taken in",
        "turn); greedy tokens against the first row's (the fp32 graph where it is there) and a speculative row's",
        "against its verifier's own.",
    ]
    for file in files:
        lines += ["", f"### {file.stem}", "", *_decode_lines(file, json.loads(file.read_text(encoding="utf-8")))]
    return "\n".join(lines) + "\n"


def make_page(reports: list[tuple[str, dict]], scale: str = "") -> str:
    """BENCHMARKS.md's text from (file name, report) pairs, and `scale` (scale_section's and decode_section's)
    before how they are taken."""
    parts = [INTRO]
    if not reports:
        parts.append(
            "No report.json is committed under `benchmarks/results/` yet, so there is no table here. Until\n"
            "there is, the last measured figures are in [docs/lab-notes/](docs/lab-notes/), each with its command.\n"
        )
    else:
        lines = ["## Where things stand", ""]
        for file, report in reports:
            lines += standing(file, report)
        parts.append("\n".join(lines) + "\n")
        paths = sorted({integer_path(r) for _, r in reports}, key=_path_rank)
        for path in paths:
            group = [(f, r) for f, r in reports if integer_path(r) == path]
            cpus = sorted({_said(_block(r, "environment").get("cpu")) for _, r in group})
            where = f"On {', '.join(cpus)}." if path != UNKNOWN else "Reports that do not say what they ran on."
            lines = [f"## Integer path `{path}`", "", where, ""]
            for file, report in group:
                lines += [*heading(file, report), "", *table(report), ""]
            parts.append("\n".join(lines).rstrip("\n") + "\n")
    if scale:
        parts.append(scale)
    parts.append(HOW)
    return "\n".join(parts)


def readme_block(reports: list[tuple[str, dict]], file: str | None = None) -> list[str]:
    """The lines README.md holds between its markers: the table of the report named `file` (default: the
    page's first), and the line that says where and how it was measured."""
    if not reports:
        return [
            "No result is committed under `benchmarks/results/` yet: [BENCHMARKS.md](BENCHMARKS.md) says how to",
            "add one; the figures measured so far are in [docs/lab-notes/](docs/lab-notes/).",
        ]
    ordered = sorted(reports, key=lambda fr: _path_rank(integer_path(fr[1])))
    chosen = ordered[0] if file is None else next((fr for fr in reports if fr[0] == file), None)
    if chosen is None:
        names = ", ".join(f for f, _ in reports)
        raise SystemExit(
            f"benchmarks_page: README.md's results marker names {file}, not in benchmarks/results/ (there: {names})"
        )
    name, report = chosen
    env, run = _block(report, "environment"), _block(report, "run")
    said = (
        f"{_said(report.get('model'))} on {_said(env.get('cpu'))} (integer path `{integer_path(report)}`, "
        f"ONNX Runtime {_said(env.get('onnxruntime'))}), by `{_said(run.get('command'))}` at commit "
        f"`{_said(run.get('commit'))}`, {_said(run.get('date'))} (`benchmarks/results/{name}`; every path's "
        "tables in [BENCHMARKS.md](BENCHMARKS.md)):"
    )
    return [said, "", *table(report)]


def rewrite_readme(text: str, reports: list[tuple[str, dict]]) -> str:
    """`text` (README.md) with the lines between its results markers made from `reports`."""
    opening = README_OPEN.search(text)
    end = text.find(README_CLOSE, opening.end()) if opening else -1
    if opening is None or end < 0:
        raise SystemExit(f"benchmarks_page: README.md has no `<!-- results -->` … `{README_CLOSE}` block to write")
    block = "\n".join(readme_block(reports, opening.group("file")))
    return text[: opening.end()] + "\n" + block + "\n" + text[end:]


def _write(path: Path, text: str) -> None:
    """Whole or not at all: a temporary file beside it, renamed."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(text.encode("utf-8"))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="folder of report.json files (default: %(default)s)"
    )
    parser.add_argument("--page", type=Path, default=PAGE, help="the page to write (default: %(default)s)")
    parser.add_argument(
        "--readme", type=Path, default=README, help="README with the results markers (default: %(default)s)"
    )
    parser.add_argument("--no-readme", action="store_true", help="write the page alone")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a page is not what the results make"
    )
    args = parser.parse_args(argv)
    reports = load_reports(args.results)
    sections = (scale_section(args.results / "scale"), decode_section(args.results / "decode"))
    page = make_page(reports, "\n".join(s for s in sections if s))
    lines = page.count("\n")
    if lines > MAX_LINES:
        print(
            f"benchmarks_page: the page would be {lines} lines, over {MAX_LINES}: move older results out of "
            f"{args.results} (the history is docs/lab-notes/)",
            file=sys.stderr,
        )
        return 1
    outputs = [(args.page, page)]
    if not args.no_readme:
        outputs.append((args.readme, rewrite_readme(args.readme.read_text(encoding="utf-8"), reports)))
    stale = [path for path, text in outputs if not path.is_file() or path.read_bytes() != text.encode("utf-8")]
    if args.check:
        for path in stale:
            print(
                f"benchmarks_page: {path} is not what {args.results} makes; run `make benchmarks-page`", file=sys.stderr
            )
        return 1 if stale else 0
    for path, text in outputs:
        if path in stale:
            _write(path, text)
    print(
        f"benchmarks_page: {args.page} ({lines} lines) from {len(reports)} report(s); "
        f"{'rewritten' if stale else 'unchanged'}: {', '.join(str(p) for p in stale) or 'none'}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
