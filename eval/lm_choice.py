"""Which row of a causal LM's report to deploy: of the rows whose perplexity on each text is within
PERPLEXITY_SLACK of the original's (the fp32 graph's), the one that decodes fastest — the least mean time per
generated token at batch 1, averaged over the bench's contexts (eval.decode_timing) — for the balanced and latency
goals, the smallest file for size, the least peak RSS for memory, and for quality the least perplexity (both texts' sum)
of any row but the original. A row off its gate is never chosen; rows within SAME of the best count as one, the
lower perplexity taken."""

from eval.latency import mean_decode_ms

__all__ = ["PERPLEXITY_SLACK", "LM_RULES", "choose_lm", "is_lm_report"]

PERPLEXITY_SLACK = 0.10  # a chosen row's perplexity may exceed the original's by this share, on each text
SAME = 1.01
LM_RULES = {  # a goal's name → (the figure it minimises, that in words)
    "balanced": ("decode", "the fastest decoding"),
    "latency": ("decode", "the fastest decoding"),
    "size": ("file", "the smallest file"),
    "memory": ("rss", "the least peak RSS"),
    "quality": ("perplexity", "the least perplexity"),
}


def _figures(row: dict) -> dict | None:
    """The row's mean ms a token (over its contexts), file, peak RSS and perplexity on both texts; None if one is
    missing."""
    figures = {
        "decode": mean_decode_ms(row),
        "file": row.get("file_bytes"),
        "rss": row.get("peak_rss_bytes"),
        "ppl": row.get("quality", {}).get("perplexity"),
        "ppl_2nd": row.get("quality_second_text", {}).get("perplexity", row.get("quality", {}).get("perplexity")),
    }
    if any(v is None for v in figures.values()):
        return None
    return {**figures, "perplexity": figures["ppl"] + figures["ppl_2nd"]}


def is_lm_report(report: dict) -> bool:
    """Whether the report's rows are timed by decoding (a causal LM's)."""
    return bool(report["variants"] and report["variants"][0].get("decode_ms"))


def choose_lm(report: dict, goal: str) -> dict | None:
    """{"goal", "row", "rule", "why", "against"} of the row to deploy for `goal` (module docstring), "against" the
    original; None when the original lacks a figure."""
    rows = {row["name"]: row for row in report["variants"]}
    base = _figures(report["variants"][0])
    if base is None:
        return None
    original = report["variants"][0]["name"]
    key, what = LM_RULES[goal]
    measured = {
        name: f
        for name, row in rows.items()
        if name != original and not row.get("gate_failed") and (f := _figures(row))
    }
    bound = {k: (1 + PERPLEXITY_SLACK) * base[k] for k in ("ppl", "ppl_2nd")}
    kept = (
        measured if key == "perplexity" else {n: f for n, f in measured.items() if all(f[k] <= bound[k] for k in bound)}
    )
    rule = f"{what} of the rows within {PERPLEXITY_SLACK:.0%} of {original}'s perplexity on each text"
    if not kept:
        why = f"no row is within {PERPLEXITY_SLACK:.0%} of {original}'s perplexity on each text"
        return {"goal": goal, "row": None, "rule": rule, "why": why, "against": original}
    least = min(f[key] for f in kept.values())
    name = min((n for n, f in kept.items() if f[key] <= SAME * least), key=lambda n: kept[n]["perplexity"])
    f = kept[name]
    why = (
        f"{name} decodes at {f['decode']:.2f} ms a token ({f['decode'] / base['decode']:.2f}× {original}'s), its file "
        f"{f['file'] / base['file']:.2f}× and its peak RSS {f['rss'] / base['rss']:.2f}× {original}'s, perplexity "
        f"{f['ppl']:.2f} / {f['ppl_2nd']:.2f} against {base['ppl']:.2f} / {base['ppl_2nd']:.2f}"
    )
    return {"goal": goal, "row": name, "rule": rule, "why": why, "against": original}
