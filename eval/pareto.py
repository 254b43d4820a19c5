"""Pareto fronts of a report: the variants no other variant beats on both quality and a cost.
A point (c, q) is dominated when some other (c', q') has c' ≤ c and q' ≥ q, one of them strictly;
the front is every point not dominated (equal points are on it together). A causal LM's latency is its mean time
per generated token over the contexts its decoding was timed at (eval.latency.mean_decode_ms), an encoder's the
p50 at LATENCY."""

import math

from compressor.errors import CompressorError
from eval.latency import latency_key, mean_decode_ms

__all__ = [
    "COSTS",
    "QUALITY",
    "LATENCY",
    "DECODE_AXIS",
    "pareto_front",
    "cost_of",
    "front_quality",
    "measured_points",
    "pareto_flags",
    "mark_pareto_",
]

QUALITY = "recall_at_10"  # the quality key the fronts maximise, unless the report names another (its graphs' kind)
LATENCY = latency_key(8, 128, 2)
DECODE_AXIS = "decode_ms: the mean over its contexts of 1000 / tokens_per_s"  # a causal LM's latency
COSTS = {  # the front's name in a row's "pareto" → where its cost is in a row (keys, outermost first)
    "file_bytes": ("file_bytes",),
    "latency": ("latency_ms", LATENCY, "p50"),
    "memory": ("peak_rss_bytes",),  # of a fresh process after one batch (eval.memory)
}


def pareto_front(points: list[tuple[float, float]]) -> list[bool]:
    """For each (cost, quality): True when no other point has cost' ≤ cost and quality' ≥ quality,
    one strictly (cost minimised, quality maximised). O(n²): a report has tens of rows."""
    return [not any(c2 <= c and q2 >= q and (c2 < c or q2 > q) for c2, q2 in points) for c, q in points]


def _measured(value) -> bool:
    return isinstance(value, int | float) and not math.isnan(value)


def cost_of(row: dict, cost: str) -> float | None:
    """The row's `cost` (a key of COSTS), or None when the row has no such measure."""
    if cost not in COSTS:
        raise CompressorError(f"a Pareto cost is one of {', '.join(COSTS)}, got {cost!r}")
    if cost == "latency" and row.get("decode_ms"):
        return mean_decode_ms(row)
    value = row
    for key in COSTS[cost]:
        value = value.get(key) if isinstance(value, dict) else None
    return value if _measured(value) else None


def front_quality(report: dict) -> str:
    """The quality key a report's fronts maximise: the one mark_pareto_ recorded, else QUALITY."""
    return report.get("front_quality", QUALITY)


def measured_points(report: dict, cost: str, quality: str = QUALITY) -> list[tuple[int, float, float]]:
    """(row index, cost, quality) of each variant that has both measures (not missing, not NaN)."""
    points = [(i, cost_of(row, cost), row.get("quality", {}).get(quality)) for i, row in enumerate(report["variants"])]
    return [(i, c, q) for i, c, q in points if c is not None and _measured(q)]


def pareto_flags(report: dict, quality: str | None = None) -> list[dict[str, bool]]:
    """Per variant, {cost: on the front of (cost, quality[`quality`])} for each cost of COSTS (quality
    default: the report's, front_quality); a row without the cost or the quality is on no front and
    leaves the others be."""
    quality = quality or front_quality(report)
    flags = [dict.fromkeys(COSTS, False) for _ in report["variants"]]
    for cost in COSTS:
        points = measured_points(report, cost, quality)
        for (i, _, _), on in zip(points, pareto_front([(c, q) for _, c, q in points])):
            flags[i][cost] = on
    return flags


def mark_pareto_(report: dict, quality: str = QUALITY) -> None:
    """In place: each row gets "pareto" ({cost: bool}, pareto_flags), and the report
    "pareto_axes", saying where each front's cost and quality come from, and "front_quality"."""
    report["front_quality"] = quality
    for row, flags in zip(report["variants"], pareto_flags(report, quality)):
        row["pareto"] = flags
    report["pareto_axes"] = {
        "quality": f"quality.{quality} (maximised)",
        **{cost: ".".join(keys) + " (minimised)" for cost, keys in COSTS.items()},
    }
    if any(row.get("decode_ms") for row in report["variants"]):
        report["pareto_axes"]["latency"] = f"{DECODE_AXIS} (minimised)"
