"""The Pareto front of a report as a PNG: quality (recall@10, top-1 agreement) against a cost on a log axis (a causal
LM's latency: its mean time per generated token), every
variant a labelled point, the original and its int8 graph marked apart, the front a step line
(the best quality to be had at each cost: q*(x) = max{q_i : c_i ≤ x}). Drawn off-screen (Agg)."""

from pathlib import Path

from compressor.errors import CompressorError
from eval.pareto import COSTS, LATENCY, front_quality, measured_points, pareto_front
from files.atomic import atomic_file

__all__ = ["plot_front"]

AXES = {  # label, scale
    "file_bytes": ("file size, MB", 1e-6),
    "latency": (f"p50 latency at {LATENCY}, ms", 1.0),
    "memory": ("peak RSS of a fresh process after one batch, MiB", 2**-20),
    "decode": ("mean time per generated token over the decoding contexts, ms", 1.0),  # a causal LM's latency
}
MARKS = {"original": ("*", "black", 220), "original-int8": ("D", "dimgray", 80)}  # marker, colour, size


def plot_front(report: dict, path: Path, x: str = "file_bytes", quality: str | None = None) -> Path:
    """Write the PNG of quality[`quality`] (default: the report's front quality) against the cost `x`
    (a key of eval.pareto.COSTS) to `path`; variants without both measures are left out."""
    quality = quality or front_quality(report)
    if x not in COSTS:
        raise CompressorError(f"a plot's x axis is one of {', '.join(COSTS)}, got {x!r}")
    points = measured_points(report, x, quality)
    if not points:
        raise CompressorError(f"no variant of the report has both {x} and {quality} to plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import LogFormatter

    rows = report["variants"]
    label, scale = AXES["decode" if x == "latency" and rows[0].get("decode_ms") else x]
    fig = Figure(figsize=(8, 5.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    on_front = pareto_front([(c, q) for _, c, q in points])
    front = sorted((c * scale, q) for (_, c, q), on in zip(points, on_front) if on)
    ax.plot(*zip(*front), drawstyle="steps-post", color="tab:blue", alpha=0.6, label="Pareto front")
    for (i, c, q), on in zip(points, on_front):
        name = rows[i]["name"]
        marker, colour, size = MARKS.get(name, ("o", "tab:blue" if on else "tab:gray", 40))
        ax.scatter(c * scale, q, marker=marker, color=colour, s=size, zorder=3, label=name if name in MARKS else None)
    ax.set_xscale("log")
    ax.autoscale_view()
    for axis_ticks in (ax.xaxis.set_major_formatter, ax.xaxis.set_minor_formatter):
        axis_ticks(LogFormatter(labelOnlyBase=False))  # 20, 30, 50 rather than 2×10¹
    ax.set_xlabel(f"{label} (log scale)")
    ax.set_ylabel(quality)
    ax.set_title(f"{report.get('model', '')}: {quality} against {label}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    _label(ax, [(rows[i]["name"], c * scale, q) for i, c, q in points])
    ax.legend(fontsize=8, loc="best")  # where it hides fewest points
    path = Path(path)
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png")
    return path


def _label(ax, points: list[tuple[str, float, float]], fontsize: int = 7) -> None:
    """Each (name, x, y) labelled beside its point, the labels pushed off each other and off the points, inside
    the axes, by adjustText (a thin line to the point where one had to move far); call it on the final layout."""
    from adjustText import adjust_text

    texts = [ax.text(x, y, name, fontsize=fontsize) for name, x, y in points]
    xs, ys = [x for _, x, _ in points], [y for _, _, y in points]
    adjust_text(
        texts, x=xs, y=ys, ax=ax, ensure_inside_axes=True, arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "gray"}
    )
