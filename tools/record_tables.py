"""The records of BENCHMARKS.md beside the reports: the LMs run at scale (benchmarks/large_models.py:
benchmarks/results/scale/*.json) and the decode records (benchmarks/lm_against_genai.py's and
benchmarks/lm_kv_cache.py's --json: benchmarks/results/decode/*.json), a table each. Standard library only."""

import json
from pathlib import Path

from tools.report_tables import shown

__all__ = ["scale_section", "decode_section"]


def _estimate(estimate: dict | None, code: int) -> str:
    """What a run was to take before its work (its record's {"minutes", "peak_gib"}, the figures the command said):
    its minutes and peak; a refused run's peak alone (what it would have needed)."""
    if not estimate:
        return "–"
    peak = f"{estimate['peak_gib']:.1f} GiB"
    return peak if code != 0 else f"{estimate['minutes']} min / {peak}"


def scale_section(folder: Path) -> str:
    """The LM runs at scale (`python benchmarks/large_models.py lms`: benchmarks/results/scale/*.json, model name →
    {"command", "commit", "date", "exit", "seconds", "shown", "stages", "environment"}), one line each; "" without."""
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
            machine = f"{shown(env.get('cpu'))}, `{shown(env.get('integer_path'))}`, {shown(env.get('onnxruntime'))}"
            before = _estimate(run.get("estimate"), run.get("exit", 0))
            stages = run.get("stages") or {}
            peak = f"{stages['peak_rss_bytes'] / 2**30:.2f} GiB" if stages else "–"
            peak = f"{run['peak_gib']:.2f} GiB" if "peak_gib" in run else peak  # one process's own, from wait4
            fp32 = ((run.get("rows") or {}).get("original") or {}).get("file_bytes")
            peak += f" ({stages['peak_rss_bytes'] / fp32:.1f}× the fp32 graph)" if stages and fp32 else ""
            tree = run.get("tree_peak_gib", 0) * 2**30  # its processes together, a measuring child among them
            if stages and fp32 and tree - stages["peak_rss_bytes"] >= 0.05 * 2**30:
                peak += f"; its processes together {tree / 2**30:.2f} GiB ({tree / fp32:.1f}×)"
            code = run.get("exit", 0)
            took = f"{run['seconds'] / 60:.1f} min" if code == 0 else f"refused (exit {code})"
            took = f"killed after {run['seconds'] / 60:.1f} min (signal {-code})" if code < 0 else took
            each = "; ".join(
                f"{s['stage']} {s['seconds']:.0f}, {s['peak_rss_bytes'] / 2**30:.2f}" for s in stages.get("stages", [])
            )
            lines.append(f"| {name} | {machine} | {before} | {took} | {peak} | {each or '–'} |")
        runs = json.loads(file.read_text(encoding="utf-8"))
        each = "; ".join(
            f"{name}: `{shown(run.get('command'))}`, commit `{shown(run.get('commit'))}`, {shown(run.get('date'))}"
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
        f"(`benchmarks/results/decode/{file.name}`: `{shown(run.get('command'))}`, commit `{shown(run.get('commit'))}`,"
        f" {shown(run.get('date'))}; {shown(env.get('cpu'))}, `{shown(env.get('integer_path'))}`, ONNX Runtime "
        f"{shown(env.get('onnxruntime'))}"
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
