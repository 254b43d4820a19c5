"""Which row of a report to deploy for a goal, measured against what a user would do otherwise (`original-int8`,
ONNX Runtime's one line) on the CPU the report was measured on. "Keeps recall" is recall@10 ≥ int8's − 0.01 on
both texts (0.05 for `size`); "as cheap as int8" is peak RSS and p50 at (1,16) one thread and (8,128) two threads
within 3 % of int8's, each p50 the median of three benches' (eval.latency.ROUNDS), taken in turns with int8's.

- **balanced** (the default): the smallest file that beats int8 on every axis (file ≤ ½ int8's, peak RSS and both
  p50 ≤ int8's, keeps recall); else the smallest file as cheap as int8 that keeps recall; int8 itself at worst, or
  where int8 is off its gate, the fastest row no larger than it in file and peak RSS.
- **size**: the smallest file that keeps recall within 0.05.
- **memory**: the least peak RSS that keeps recall.
- **latency**: the least p50 at (8,128) on two threads that keeps recall.
- **quality**: the best recall (both texts' sum) of the rows no larger than int8's file and as cheap as it.

Sizes (or costs) within 1 % of each other count as one, the better recall taken. A row off its gate (its
graph's metadata says so: "gate_failed") is never chosen."""

from eval.latency import latency_key

__all__ = ["BASELINE", "GOALS", "DEFAULT_GOAL", "RECALL_SLACK", "COST_SLACK", "choose"]

BASELINE = "original-int8"
RECALL_SLACK = 0.01  # recall@10 a chosen row may lose against int8's, on each text
SIZE_RECALL_SLACK = 0.05  # the same for the size goal
COST_SLACK = 1.03  # "as cheap as int8": peak RSS and p50 within this of int8's
SAME = 1.01  # sizes or costs this near count as one: the better recall is taken
LATENCIES = (latency_key(1, 16, 1), latency_key(8, 128, 2))
QUALITY = "recall_at_10"
GOALS = {
    "balanced": "the smallest file that beats original-int8 on every axis, else the smallest as cheap as it",
    "size": "the smallest file within 0.05 of original-int8's recall",
    "memory": "the least peak RSS that keeps original-int8's recall",
    "latency": "the least p50 at (8,128) on two threads that keeps original-int8's recall",
    "quality": "the best recall no larger and no dearer than original-int8",
}
DEFAULT_GOAL = "balanced"


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


def _keeps_recall(figures: dict, base: dict, slack: float = RECALL_SLACK) -> bool:
    return all(figures[k] >= base[k] - slack for k in ("recall", "recall_2nd"))


def _costs_at_most(figures: dict, base: dict, slack: float) -> bool:
    return all(figures[k] <= slack * base[k] for k in ("rss", *LATENCIES))


def _least(rows: dict[str, dict], key: str) -> str | None:
    """The row of the least `key`, those within SAME of it counted equal and the better recall taken; None of no
    rows."""
    if not rows:
        return None
    least = min(f[key] for f in rows.values())
    near = {n: f for n, f in rows.items() if f[key] <= SAME * least}
    return max(near, key=lambda n: (near[n]["recall"] + near[n]["recall_2nd"], -near[n][key]))


def _ratios(figures: dict, base: dict) -> str:
    p50 = " and ".join(f"{figures[k] / base[k]:.2f}×" for k in LATENCIES)
    return (
        f"{figures['file'] / base['file']:.2f}× int8's file, {figures['rss'] / base['rss']:.2f}× its peak RSS, "
        f"{p50} its p50 at (1,16) t1 and (8,128) t2, recall@10 {figures['recall']:.3f} / "
        f"{figures['recall_2nd']:.3f} against {base['recall']:.3f} / {base['recall_2nd']:.3f}"
    )


def _balanced(rows: dict[str, dict], base: dict) -> tuple[str, str, str]:
    beats = {
        n: f
        for n, f in rows.items()
        if f["file"] <= 0.5 * base["file"] and _costs_at_most(f, base, 1.0) and _keeps_recall(f, base)
    }
    if beats:
        name = _least(beats, "file")
        return name, "beats int8", f"{name} beats {BASELINE} on every axis"
    cheap = {n: f for n, f in rows.items() if _costs_at_most(f, base, COST_SLACK) and _keeps_recall(f, base)}
    name = _least(cheap, "file")
    if name is None and base["off_gate"]:
        return _in_int8s_place(rows, base)
    return name and (
        name,
        "as cheap as int8",
        (
            f"no row beats {BASELINE} on every axis on this CPU; {name} is the smallest file as cheap as it (peak RSS "
            f"and p50 within {COST_SLACK - 1:.0%}) that keeps its recall"
        ),
    )


def _in_int8s_place(rows: dict[str, dict], base: dict) -> tuple[str, str, str] | None:
    """int8 off its gate (activations one int8 scale cannot hold) is no row to deploy: in its place, of the rows
    no larger than it in file and peak RSS (within SAME and COST_SLACK), the fastest at (8,128) t2."""
    fits = {n: f for n, f in rows.items() if f["file"] <= SAME * base["file"] and f["rss"] <= COST_SLACK * base["rss"]}
    name = _least(fits, LATENCIES[1])
    return name and (
        name,
        "in int8's place",
        (
            f"{BASELINE} is off its gate and no row is as cheap as it on this CPU; {name} is the fastest at (8,128) t2 "
            f"of the rows no larger than it in file and peak RSS"
        ),
    )


def _by(key: str, slack: float, what: str):
    def rule(rows: dict[str, dict], base: dict) -> tuple[str, str, str]:
        kept = {n: f for n, f in rows.items() if _keeps_recall(f, base, slack)}
        name = _least(kept, key)
        return name and (
            name,
            f"least {what}",
            f"{name} has the least {what} of the rows within {slack} of {BASELINE}'s recall",
        )

    return rule


def _quality(rows: dict[str, dict], base: dict) -> tuple[str, str, str]:
    cheap = {n: f for n, f in rows.items() if f["file"] <= base["file"] and _costs_at_most(f, base, COST_SLACK)}
    if not cheap:
        return None
    name = max(cheap, key=lambda n: (cheap[n]["recall"] + cheap[n]["recall_2nd"], -cheap[n]["file"]))
    return name, "best recall", f"{name} keeps the most recall of the rows no larger and no dearer than {BASELINE}"


RULES = {
    "balanced": _balanced,
    "size": _by("file", SIZE_RECALL_SLACK, "file"),
    "memory": _by("rss", RECALL_SLACK, "peak RSS"),
    "latency": _by(LATENCIES[1], RECALL_SLACK, "p50 at (8,128) t2"),
    "quality": _quality,
}


def choose(report: dict, goal: str = DEFAULT_GOAL) -> dict | None:
    """{"goal", "row", "rule", "why"} of the report's row to deploy for `goal` (module docstring; "row" None when no
    row qualifies: int8 itself off its gate, say); None when the report has no int8 row with every figure (kept
    off its gate, it is still what a user would do otherwise, and the measure of the others)."""
    rows = {row["name"]: row for row in report["variants"]}
    base = _figures(rows[BASELINE]) if BASELINE in rows else None
    if base is None:
        return None
    base["off_gate"] = bool(rows[BASELINE].get("gate_failed"))
    measured = {
        name: f
        for name, row in rows.items()
        if name != "original" and not row.get("gate_failed") and (f := _figures(row))
    }
    chosen = RULES[goal](measured, base)
    if chosen is None:
        return {"goal": goal, "row": None, "rule": "none", "why": f"no row qualifies for {goal}: {GOALS[goal]}"}
    name, rule, why = chosen
    return {"goal": goal, "row": name, "rule": rule, "why": f"{why}: {_ratios(measured[name], base)}"}
