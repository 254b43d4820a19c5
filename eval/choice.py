"""Which row of a report to deploy, by the rule measured against what a user would do otherwise (`original-int8`,
ONNX Runtime's one line), on the CPU the report was measured on:

1. **beats int8**: file ≤ ½ int8's, peak RSS ≤ int8's, p50 ≤ int8's at (1,16) one thread and (8,128) two
   threads, recall@10 ≥ int8's − 0.01 on both texts; the smallest file of those;
2. else **as cheap as int8**: peak RSS and both p50 within 3 % of int8's, recall@10 ≥ int8's − 0.01 on both
   texts; the smallest file of those, files within 1 % of each other counted equal and the better recall taken;
3. else int8 itself.

A row off its gate (its graph's metadata says so: "gate_failed") is never chosen."""

from eval.latency import latency_key

__all__ = ["BASELINE", "RECALL_SLACK", "COST_SLACK", "choose"]

BASELINE = "original-int8"
RECALL_SLACK = 0.01  # recall@10 a chosen row may lose against int8's, on each text
COST_SLACK = 1.03  # the second rule's peak RSS and p50, against int8's
SAME_FILE = 1.01  # files this near count as one size: the better recall is taken
LATENCIES = (latency_key(1, 16, 1), latency_key(8, 128, 2))
QUALITY = "recall_at_10"


def _figures(row: dict) -> dict | None:
    """The row's file, peak RSS, the LATENCIES' p50 and recall on both texts; None when one is missing."""
    latency = row.get("latency_ms", {})
    figures = {
        "file": row.get("file_bytes"),
        "rss": row.get("peak_rss_bytes"),
        **{key: latency.get(key, {}).get("p50") for key in LATENCIES},
        "recall": row.get("quality", {}).get(QUALITY),
        "recall_2nd": row.get("quality_second_text", {}).get(QUALITY),
    }
    return None if any(v is None for v in figures.values()) else figures


def _keeps_recall(figures: dict, base: dict) -> bool:
    return all(figures[k] >= base[k] - RECALL_SLACK for k in ("recall", "recall_2nd"))


def _costs_at_most(figures: dict, base: dict, slack: float) -> bool:
    return all(figures[k] <= slack * base[k] for k in ("rss", *LATENCIES))


def _ratios(figures: dict, base: dict) -> str:
    p50 = " and ".join(f"{figures[k] / base[k]:.2f}×" for k in LATENCIES)
    return (
        f"{figures['file'] / base['file']:.2f}× int8's file, {figures['rss'] / base['rss']:.2f}× its peak RSS, "
        f"{p50} its p50 at (1,16) t1 and (8,128) t2, recall@10 {figures['recall']:.3f} / "
        f"{figures['recall_2nd']:.3f} against {base['recall']:.3f} / {base['recall_2nd']:.3f}"
    )


def choose(report: dict) -> dict | None:
    """{"row", "rule", "why"} of the report's row to deploy (module docstring); None when the report has no
    int8 row with every figure."""
    rows = {row["name"]: row for row in report["variants"]}
    base = _figures(rows[BASELINE]) if BASELINE in rows else None
    if base is None:
        return None
    measured = {
        name: f
        for name, row in rows.items()
        if name != "original" and not row.get("gate_failed") and (f := _figures(row))
    }
    beats = {
        n: f
        for n, f in measured.items()
        if f["file"] <= 0.5 * base["file"] and _costs_at_most(f, base, 1.0) and _keeps_recall(f, base)
    }
    if beats:
        name = min(beats, key=lambda n: beats[n]["file"])
        why = f"{name} beats {BASELINE} on every axis: {_ratios(beats[name], base)}"
        return {"row": name, "rule": "beats int8", "why": why}
    cheap = {n: f for n, f in measured.items() if _costs_at_most(f, base, COST_SLACK) and _keeps_recall(f, base)}
    smallest = min(f["file"] for f in cheap.values())
    near = {n: f for n, f in cheap.items() if f["file"] <= SAME_FILE * smallest}
    name = max(near, key=lambda n: (near[n]["recall"] + near[n]["recall_2nd"], -near[n]["file"]))
    why = (
        f"no row beats {BASELINE} on every axis on this CPU; {name} is the smallest file as cheap as it (peak RSS and "
        f"p50 within {COST_SLACK - 1:.0%}) that keeps its recall: {_ratios(cheap[name], base)}"
    )
    return {"row": name, "rule": "as cheap as int8", "why": why}
