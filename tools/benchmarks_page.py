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

from tools.record_tables import decode_section, scale_section
from tools.report_tables import UNKNOWN, block, heading, integer_path, path_rank, shown, standing, table

__all__ = [
    "main",
    "make_page",
    "readme_block",
    "rewrite_readme",
    "load_reports",
    "table",
    "heading",
    "scale_section",
    "decode_section",
]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "BENCHMARKS.md"
README = ROOT / "README.md"
MAX_LINES = 300
# README.md's block: `<!-- results -->` (the first report of the page) or `<!-- results: NAME.json -->`, then
# the closing marker; everything between them is the script's
README_OPEN = re.compile(r"^<!-- results(?::\s*(?P<file>[^ ]+?))?\s*-->$", re.MULTILINE)
README_CLOSE = "<!-- /results -->"


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
  runs one (8, 128) batch (an LM's: a 128-token prompt at batch 1, then 16 tokens decoded). p50: ONNX Runtime on
  the CPU, `ORT_ENABLE_ALL`, the graphs taking turns, at (batch, sequence) on 1 or 2 intra-op threads, on the eval
  text's own tokens.
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
        paths = sorted({integer_path(r) for _, r in reports}, key=path_rank)
        for path in paths:
            group = [(f, r) for f, r in reports if integer_path(r) == path]
            cpus = sorted({shown(block(r, "environment").get("cpu")) for _, r in group})
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
    ordered = sorted(reports, key=lambda fr: path_rank(integer_path(fr[1])))
    chosen = ordered[0] if file is None else next((fr for fr in reports if fr[0] == file), None)
    if chosen is None:
        names = ", ".join(f for f, _ in reports)
        raise SystemExit(
            f"benchmarks_page: README.md's results marker names {file}, not in benchmarks/results/ (there: {names})"
        )
    name, report = chosen
    env, run = block(report, "environment"), block(report, "run")
    said = (
        f"{shown(report.get('model'))} on {shown(env.get('cpu'))} (integer path `{integer_path(report)}`, "
        f"ONNX Runtime {shown(env.get('onnxruntime'))}), by `{shown(run.get('command'))}` at commit "
        f"`{shown(run.get('commit'))}`, {shown(run.get('date'))} (`benchmarks/results/{name}`; every path's "
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
