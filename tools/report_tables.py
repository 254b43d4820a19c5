"""The tables of BENCHMARKS.md made from report.json files (one `compressor run` / `sweep` / `bench` report each,
docs/texts-and-measuring.md): what a report's figures were measured on and by, its table of rows with each figure's
ratio to the original's, and its rows on each Pareto front. A block or figure a report lacks is said as "unknown" or
"–". Standard library only."""

import re

__all__ = [
    "SETTINGS",
    "UNKNOWN",
    "QUALITY_NAMES",
    "block",
    "shown",
    "integer_path",
    "path_rank",
    "quality_metric",
    "table",
    "heading",
    "standing",
]

# The two latency columns: (batch, sequence, intra-op threads)
SETTINGS = ((1, 16, 1), (8, 128, 2))
# The integer paths in eval/environment.py's order, best first; any other name after them, "unknown" last
PATH_ORDER = ("amx", "avx512_vnni", "avx_vnni", "avx512", "avx2", "arm64_dot", "arm64", "sse")
UNKNOWN = "unknown"
# Each Pareto front of a row's "pareto" (eval/pareto.py) by the name report.md gives it
FRONT_NAMES = {"file_bytes": "size", "latency": "p50", "memory": "RSS"}
QUALITY_NAMES = {"recall_at_10": "recall@10", "top1_agreement": "top-1 agreement", "perplexity": "perplexity"}
LATENCY_KEY = re.compile(r"^b(\d+)_s(\d+)_t(\d+)$|^\((\d+),(\d+)\)t(\d+)$")  # b8_s128_t2 or "(8,128) t2"
MIB = 2**20


def block(report: dict, name: str) -> dict:
    block = report.get(name)
    return block if isinstance(block, dict) else {}


def shown(value) -> str:
    return UNKNOWN if value in (None, "") else str(value)


def integer_path(report: dict) -> str:
    return shown(block(report, "environment").get("integer_path"))


def path_rank(path: str) -> tuple:
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
    env, run = block(report, "environment"), block(report, "run")
    cores = f", {env['cores']} cores" if env.get("cores") else ""
    versions = ", ".join(
        f"{label} {shown(env.get(key))}"
        for label, key in (("torch", "torch"), ("transformers", "transformers"), ("Python", "python"))
    )
    lines = [
        f"- CPU: {shown(env.get('cpu'))}{cores}; integer path `{integer_path(report)}`",
        f"- ONNX Runtime {shown(env.get('onnxruntime'))}; {versions}",
        f"- command: `{shown(run.get('command'))}`",
        f"- commit: `{shown(run.get('commit'))}`; date: {shown(run.get('date'))}",
        f"- quality on: {shown(report.get('eval_text'))}; 2nd: {shown(report.get('second_text'))}",
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
    return [f"### {shown(report.get('model'))} (`benchmarks/results/{file}`)", "", *lines]


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
    env, metric = block(report, "environment"), quality_metric(report)
    emulated = ", emulated" if env.get("emulated") else ""
    lines = [
        f"- **{shown(report.get('model'))}** on {shown(env.get('cpu'))} (`{integer_path(report)}`{emulated}), "
        f"`{shown(block(report, 'run').get('command'))}`; {QUALITY_NAMES.get(metric, metric)} eval / 2nd in brackets:"
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
