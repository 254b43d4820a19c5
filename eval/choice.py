"""Which row of a report to deploy for a goal, measured against what a user would do otherwise (`original-int8`,
ONNX Runtime's one line) on the CPU the report was measured on. "Keeps recall" is recall@10 ≥ int8's − 0.01 on
both texts (0.05 for `size`). "As cheap as int8" reads the run's own noise: at (1,16) one thread and (8,128) two
threads, the row's benches (eval.latency: 5 to 7, taken in turns with int8's) and int8's overlap — its fastest
bench's p50 no slower than int8's slowest, so that the run cannot tell the two apart — peak RSS (the least of fresh
processes, steady to well under 1 %) within 1 % of int8's and the file within FILE_SAME of it.

- **balanced** (the default): the smallest file as cheap as int8 that keeps recall, files within FILE_SAME of each
  other one size and the better recall taken; "beats int8" when that file is ≤ ½ int8's. Where int8 is off its gate
  (activations one int8 scale cannot hold), the rows are measured against the one-line 8-bit row on its gate (the
  original in one scheme, as `original-SCHEME` names it: int8-aware, never a recipe's row, a candidate) that is
  fastest at (8,128) t2 of those no larger than int8's file, in its place.
- **size**: the smallest file that keeps recall within 0.05.
- **memory**: the least peak RSS that keeps recall.
- **latency**: the least p50 at (8,128) on two threads that keeps recall.
- **quality**: the best recall (both texts' sum) of the rows no larger than int8's file and as cheap as it.

Sizes (or costs) within 1 % of each other count as one (files: FILE_SAME), the better recall taken. A row off its
gate (its graph's metadata says so: "gate_failed") is never chosen. Each goal (eval.goals) names its rule here."""

from eval.latency import latency_key

__all__ = ["BASELINE", "RECALL_SLACK", "FILE_SAME", "RULES", "choose_encoder"]

BASELINE = "original-int8"
RECALL_SLACK = 0.01  # recall@10 a chosen row may lose against int8's, on each text
SIZE_RECALL_SLACK = 0.05  # the same for the size goal
SAME = 1.01  # sizes or costs this near count as one: the better recall is taken (peak RSS: "as cheap as int8")
FILE_SAME = 1.03  # files this near count as one size: int8-aware's smoothing adds 0.3 % to int8's
LATENCIES = (latency_key(1, 16, 1), latency_key(8, 128, 2))
QUALITY = "recall_at_10"


def _figures(row: dict) -> dict | None:
    """The row's file, peak RSS, the LATENCIES' p50 and recall on both texts; None when one is missing. Beside
    them, under "slowest" and "fastest", each p50's slowest and fastest bench (the p50 itself where the rounds are
    not in the report), "width", the bits its graph's weights are named by (its metadata: eval.benchmark.WIDTH_KEY;
    None: not said), and "one_line", whether it is the original in one scheme with its defaults (original-SCHEME;
    a row whose scheme the report does not say counts as one)."""
    latency = row.get("latency_ms", {})
    figures = {
        "file": row.get("file_bytes"),
        "rss": row.get("peak_rss_bytes"),
        **{key: latency.get(key, {}).get("p50") for key in LATENCIES},
        "recall": row.get("quality", {}).get(QUALITY),
        "recall_2nd": row.get("quality_second_text", {}).get(QUALITY),
    }
    if any(v is None for v in figures.values()):
        return None
    rounds = {key: latency[key].get("p50_rounds") or [figures[key]] for key in LATENCIES}
    figures["slowest"] = {key: max(rounds[key]) for key in LATENCIES}
    figures["fastest"] = {key: min(rounds[key]) for key in LATENCIES}
    figures["width"] = row.get("width")
    scheme = row.get("quantization", {}).get("scheme")  # none said (a bench of folders): taken as one line
    figures["one_line"] = scheme is None or row["name"] == f"original-{scheme}"
    return figures


def _keeps_recall(figures: dict, base: dict, slack: float = RECALL_SLACK) -> bool:
    return all(figures[k] >= base[k] - slack for k in ("recall", "recall_2nd"))


def _as_cheap(figures: dict, base: dict) -> bool:
    """Each p50's benches overlapping the base's (the fastest no slower than the base's slowest), peak RSS within
    SAME of its own and the file within FILE_SAME: what the run measured between its rounds, not a fixed band."""
    return (
        all(figures["fastest"][k] <= base["slowest"][k] for k in LATENCIES)
        and figures["rss"] <= SAME * base["rss"]
        and figures["file"] <= FILE_SAME * base["file"]
    )


def _least(rows: dict[str, dict], key: str, same: float = SAME) -> str | None:
    """The row of the least `key`, those within `same` of it counted equal and the better recall taken; None of no
    rows."""
    if not rows:
        return None
    least = min(f[key] for f in rows.values())
    near = {n: f for n, f in rows.items() if f[key] <= same * least}
    return max(near, key=lambda n: (near[n]["recall"] + near[n]["recall_2nd"], -near[n][key]))


def _ratios(figures: dict, base: dict) -> str:
    p50 = " and ".join(f"{figures[k] / base[k]:.2f}×" for k in LATENCIES)
    spread = " and ".join(
        f"{figures['fastest'][k] / base[k]:.2f}–{figures['slowest'][k] / base[k]:.2f}× against "
        f"{base['fastest'][k] / base[k]:.2f}–{base['slowest'][k] / base[k]:.2f}×"
        for k in LATENCIES
    )
    return (
        f"{figures['file'] / base['file']:.2f}× {base['name']}'s file, {figures['rss'] / base['rss']:.2f}× its peak "
        f"RSS, {p50} its p50 at (1,16) t1 and (8,128) t2 (the benches {spread}), recall@10 "
        f"{figures['recall']:.3f} / {figures['recall_2nd']:.3f} against {base['recall']:.3f} / "
        f"{base['recall_2nd']:.3f}"
    )


def _balanced(rows: dict[str, dict], base: dict) -> tuple[str, str, str] | None:
    cheap = {n: f for n, f in rows.items() if _as_cheap(f, base) and _keeps_recall(f, base)}
    name = _least(cheap, "file", FILE_SAME)
    if name is None:
        return None
    if rows[name]["file"] <= 0.5 * base["file"]:
        return name, "beats int8", f"{name} beats {base['name']} on every axis (half its file or less)"
    why = (
        f"no row beats {base['name']} on every axis on this CPU; {name} is the smallest file as cheap as it (its "
        f"benches and {base['name']}'s overlap at each shape, peak RSS within {SAME - 1:.0%}, the file within "
        f"{FILE_SAME - 1:.0%}) that keeps its recall"
    )
    return name, "as cheap as int8", why


def _by(key: str, slack: float, what: str):
    def rule(rows: dict[str, dict], base: dict) -> tuple[str, str, str]:
        kept = {n: f for n, f in rows.items() if _keeps_recall(f, base, slack)}
        name = _least(kept, key)
        return name and (
            name,
            f"least {what}",
            f"{name} has the least {what} of the rows within {slack} of {base['name']}'s recall",
        )

    return rule


def _quality(rows: dict[str, dict], base: dict) -> tuple[str, str, str]:
    cheap = {n: f for n, f in rows.items() if _as_cheap(f, base)}
    if not cheap:
        return None
    name = max(cheap, key=lambda n: (cheap[n]["recall"] + cheap[n]["recall_2nd"], -cheap[n]["file"]))
    return name, "best recall", f"{name} keeps the most recall of the rows no larger and no dearer than {base['name']}"


RULES = {  # a goal's name → its rule: (rows' figures, the base's) → (row, rule, why) or None
    "balanced": _balanced,
    "size": _by("file", SIZE_RECALL_SLACK, "file"),
    "memory": _by("rss", RECALL_SLACK, "peak RSS"),
    "latency": _by(LATENCIES[1], RECALL_SLACK, "p50 at (8,128) t2"),
    "quality": _quality,
}


def _in_int8s_place(rows: dict[str, dict], int8: dict) -> str | None:
    """Of the one-line 8-bit rows on their gate no larger than int8's file (within FILE_SAME), the fastest at (8,128)
    t2: the measure in the place of an int8 off its gate (a candidate measured against itself decides nothing)."""
    eight = {
        n: f for n, f in rows.items() if f["one_line"] and f["width"] == 8 and f["file"] <= FILE_SAME * int8["file"]
    }
    return min(eight, key=lambda n: eight[n][LATENCIES[1]]) if eight else None


def choose_encoder(report: dict, goal: str, deploys: str) -> dict | None:
    """{"goal", "row", "rule", "why", "against"} of the report's row to deploy for `goal` (its rule RULES[goal], said
    `deploys`; module docstring; "row" None when no row qualifies: no 8-bit row on its gate, say), "against" the row
    it was measured against (int8, or the one in its place); None when the report has no int8 row with every figure
    (kept off its gate, it is still what a user would do otherwise, and the measure of the others)."""
    rows = {row["name"]: row for row in report["variants"]}
    int8 = _figures(rows[BASELINE]) if BASELINE in rows else None
    if int8 is None:
        return None
    measured = {
        name: {**f, "name": name}
        for name, row in rows.items()
        if name != "original" and not row.get("gate_failed") and (f := _figures(row))
    }
    against = _in_int8s_place(measured, int8) if rows[BASELINE].get("gate_failed") else BASELINE
    chosen = against and RULES[goal](measured, measured[against])
    if not chosen:
        why = f"no row qualifies for {goal}: {deploys}"
        if against is None:
            why = (
                f"{BASELINE} is off its gate and no other one-line 8-bit row is on its own: nothing to measure against"
            )
        return {"goal": goal, "row": None, "rule": "none", "why": why, "against": against}
    name, rule, why = chosen
    if against != BASELINE:
        why = (
            f"{BASELINE} is off its gate: measured against {against}, the fastest one-line 8-bit row on its gate; {why}"
        )
    return {
        "goal": goal,
        "row": name,
        "rule": rule,
        "why": f"{why}: {_ratios(measured[name], measured[against])}",
        "against": against,
    }
