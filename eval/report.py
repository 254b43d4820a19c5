"""report.json (the contract docs/texts-and-measuring.md describes) and report.md (a table with ratios to the
original)."""

import json
from pathlib import Path

from eval.pareto import LATENCY, cost_of, front_quality, pareto_flags
from files.atomic import atomic_file

__all__ = ["write_report", "markdown_table"]

MIB = 2**20
# each Pareto front (eval.pareto.COSTS): (its name in the front column, what its cost is)
FRONTS = {
    "file_bytes": ("size", "file size"),
    "latency": ("p50", f"p50 latency at {LATENCY}"),
    "memory": ("RSS", "peak RSS"),
}


def _fronts(report: dict) -> dict[str, tuple[str, str]]:
    """FRONTS, a causal LM's latency front named by what it measures (eval.pareto: its mean time per token)."""
    if report["variants"] and report["variants"][0].get("decode_ms"):
        return {**FRONTS, "latency": ("decode", "mean time per generated token")}
    return FRONTS


def _ratio(value, base) -> str:
    return f"{value / base:.3f}×" if value is not None and base else "–"


def markdown_table(report: dict) -> str:
    """One row per variant; each figure next to its ratio to the original of the same run, and
    the Pareto fronts (recall@10 against file size, against p50 latency) the variant is on."""
    variants = report["variants"]
    base = variants[0]
    keys = list(base.get("latency_ms", {}))
    decodes = list(base.get("decode_ms", {}))  # an LM's contexts
    quality = [("quality", q, q) for q in base.get("quality", {})]  # (row key, metric, column)
    quality += [("quality_second_text", q, f"{q} (2nd)") for q in base.get("quality_second_text", {})]
    head = ["variant", "front", "params", "file MB", "opt. init MB", "peak RSS MiB (Δ over baseline)"]
    head += ["peak RSS MiB after session, (1,16)"]
    head += [f"{k} p50 ms" for k in keys] + [f"ms/token {c}" for c in decodes]
    head += [column for _, _, column in quality] + ["parity max|Δ|"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v, fronts in zip(variants, pareto_flags(report)):
        rss, opt = v.get("peak_rss_bytes"), v["optimized_initializer_bytes"]
        cells = [
            v["name"] + (" (off its gate)" if v.get("gate_failed") else ""),
            "+".join(_fronts(report)[cost][0] for cost, on in fronts.items() if on) or "–",
            f"{v['params']:,} ({_ratio(v['params'], base['params'])})",
            f"{v['file_bytes'] / 1e6:.2f} ({_ratio(v['file_bytes'], base['file_bytes'])})",
            f"{opt / 1e6:.2f} ({opt / v['file_bytes']:.3f}× file)",
        ]
        if rss is None:
            cells.append("–")
        else:
            delta = (rss - v["baseline_rss_bytes"]) / MIB
            cells.append(f"{rss / MIB:.0f} ({delta:.0f}; {_ratio(rss, base.get('peak_rss_bytes'))})")
        stages = v.get("rss_stages", {})
        peaks = [stages[s]["peak_bytes"] / MIB for s in ("session", "b1_s16") if s in stages]
        cells.append(", ".join(f"{p:.0f}" for p in peaks) or "–")
        for k in keys:
            lat = v.get("latency_ms", {}).get(k)
            cells.append(
                "–" if lat is None else f"{lat['p50']:.2f} ({_ratio(lat['p50'], base['latency_ms'][k]['p50'])})"
            )
        for c in decodes:
            step = v.get("decode_ms", {}).get(c)
            p50 = None if step is None else step["per_token_p50_ms"]
            cells.append("–" if p50 is None else f"{p50:.2f} ({_ratio(p50, base['decode_ms'][c]['per_token_p50_ms'])})")
        cells += [f"{v.get(field, {}).get(q, float('nan')):.3f}" for field, q, _ in quality]
        parity = v.get("parity_max_abs")
        cells.append("–" if parity is None else f"{parity:.1e}")
        rows.append("| " + " | ".join(cells) + " |")
    title = f"# compressor report\n\nmodel: `{report['model']}`  \nquality measured on: {report['eval_text']}"
    if "second_text" in report:
        title += f"  \nand (2nd) on: {report['second_text']}"
    if "latency_input" in report:
        title += f"  \nlatency on: {report['latency_input']}"
    title += _measured_on(report)
    fronts = " or ".join(f"{what} ({label})" for label, what in _fronts(report).values())
    title += f"  \nfront: no other variant is as good in {front_quality(report)} and in {fronts}, and better in one\n\n"
    return title + _choice(report) + _left_out(report) + _headline(report) + "\n".join(rows) + "\n"


def _left_out(report: dict) -> str:
    """The rows the bench could not measure, each with what failed."""
    failed = report.get("failed") or ()
    return "".join(f"left out: **{f['name']}** ({f['error']})  \n" for f in failed) + ("\n" if failed else "")


def _choice(report: dict) -> str:
    """The row to deploy on this CPU and why, in a sentence (eval.choice)."""
    choice = report.get("choice")
    if not choice:
        return ""
    chosen = f"**deploy {choice['row']}**" if choice["row"] else "**nothing to deploy**"
    return f"{chosen} (goal {choice['goal']}: {choice['rule']}): {choice['why']}\n\n"


def _measured_on(report: dict) -> str:
    """The line that ties the report's figures to their machine, libraries and command (eval.environment)."""
    env, run = report.get("environment"), report.get("run")
    if not env:
        return ""
    line = f"  \nmeasured on: {env['cpu']}, {env['cores']} cores, integer path {env['integer_path']}; ONNX Runtime "
    line += f"{env['onnxruntime']}, torch {env['torch']}, transformers {env['transformers']}, Python {env['python']}"
    if run:
        line += f"  \nby: `{run['command']}` at {run['commit'] or 'no git commit'}, {run['date']}"
    return line


def _headline(report: dict) -> str:
    """A line per front: its variants but the original, cheapest first, each with its cost against the
    original's and its quality on both texts, the second as prominently as the first."""
    variants, quality = report["variants"], front_quality(report)
    texts = [("quality", "eval text")] + ([("quality_second_text", "2nd text")] if "second_text" in report else [])
    lines = []
    for cost, (label, what) in _fronts(report).items():
        base = cost_of(variants[0], cost)
        on = [v for v, flags in zip(variants[1:], pareto_flags(report)[1:]) if flags[cost]]
        items = []
        for v in sorted(on, key=lambda v: cost_of(v, cost)):
            scores = " / ".join(f"{v.get(key, {}).get(quality, float('nan')):.3f} ({name})" for key, name in texts)
            items.append(f"**{v['name']}** {_ratio(cost_of(v, cost), base)} {what}, {quality} {scores}")
        if items:
            lines.append(f"on the {label} front: " + "; ".join(items))
    return "".join(f"{line}  \n" for line in lines) + ("\n" if lines else "")


def _write_text(path: Path, text: str) -> None:
    """A reader never sees half a report."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def write_report(report: dict, json_path: Path) -> tuple[Path, Path]:
    """Write report.json and, beside it, report.md (same stem)."""
    json_path = Path(json_path)
    md_path = json_path.with_suffix(".md")
    _write_text(json_path, json.dumps(report, indent=2) + "\n")
    _write_text(md_path, markdown_table(report))
    return json_path, md_path
