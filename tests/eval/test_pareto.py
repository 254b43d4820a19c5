"""Pareto fronts of a report, the front column of report.md, and the PNG plot of a front."""

import math

import numpy as np
import pytest

from compressor.errors import CompressorError
from eval.pareto import mark_pareto_, pareto_flags, pareto_front
from eval.plot import plot_front
from eval.report import markdown_table

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "points, front",
    [
        ([(1.0, 0.5)], [True]),  # a single point
        ([], []),
        ([(1, 0.9), (2, 0.8)], [True, False]),  # dearer and worse
        ([(1, 0.8), (2, 0.9)], [True, True]),  # a trade-off
        ([(1, 0.9), (1, 0.8)], [True, False]),  # same cost, worse quality
        ([(1, 0.9), (2, 0.9)], [True, False]),  # same quality, dearer
        ([(1, 0.9), (1, 0.9), (3, 0.7)], [True, True, False]),  # equal points share the front
        ([(3, 1.0), (1, 0.2), (2, 0.6), (2.5, 0.5), (4, 0.99)], [True, True, True, False, False]),
    ],
)
def test_pareto_front(points, front):
    assert pareto_front(points) == front


def row(name, size, p50, recall, rss):
    return {
        "name": name,
        "params": size // 4,
        "file_bytes": size,
        "peak_rss_bytes": rss,
        "baseline_rss_bytes": 40_000_000,
        "optimized_initializer_bytes": size,
        "latency_ms": {"b8_s128_t2": {"p50": p50, "p90": p50 * 1.1}},
        "quality": {"cosine_mean": 0.9, "recall_at_10": recall},
    }


@pytest.fixture
def report():
    return {
        "model": "hand-made",
        "eval_text": "none",
        "variants": [
            row("original", 90_000_000, 68.0, 1.0, 200_000_000),
            row("original-int8", 23_000_000, 35.0, 0.9, 120_000_000),
            row("tt-r64", 50_000_000, 75.0, 0.95, 150_000_000),  # smaller than the original, slower
            row("fast", 95_000_000, 30.0, 0.92, 250_000_000),  # larger than the original, fastest
            row("tt-r16", 46_000_000, 70.0, 0.6, 140_000_000),  # beaten by int8 on both
            row("lowrank", 20_000_000, 34.0, 0.5, 100_000_000),  # smallest
            row("nan", 10_000_000, 10.0, math.nan, 50_000_000),  # quality not measured: on no front
        ],
    }


def test_report_rows_are_marked_on_each_front(report):
    mark_pareto_(report)
    marks = {r["name"]: tuple(r["pareto"][c] for c in ("file_bytes", "latency", "memory")) for r in report["variants"]}
    assert marks == {
        "original": (True, True, True),
        "original-int8": (True, False, True),
        "tt-r64": (True, False, True),
        "fast": (False, True, False),  # the original holds less memory at a better recall
        "tt-r16": (False, False, False),
        "lowrank": (True, False, True),
        "nan": (False, False, False),
    }
    assert report["pareto_axes"]["memory"] == "peak_rss_bytes (minimised)"
    assert "b8_s128_t2" in report["pareto_axes"]["latency"]


def test_a_row_without_a_measure_is_on_no_front_of_it_and_dominates_nothing(report):
    del report["variants"][3]["latency_ms"]  # fast: no latency
    flags = pareto_flags(report)
    assert flags[3] == {"file_bytes": False, "latency": False, "memory": False}
    assert flags[1] == {"file_bytes": True, "latency": True, "memory": True}  # int8, no longer beaten by fast


def test_the_table_names_the_fronts_of_each_row(report):
    table = markdown_table(report)
    head, *rows = [line.strip("| ").split(" | ") for line in table.splitlines() if line.startswith("| ")]
    assert head[:2] == ["variant", "front"]
    cells = {name: front for name, front, *_ in rows}
    assert cells == {
        "original": "size+p50+RSS",
        "original-int8": "size+RSS",
        "tt-r64": "size+RSS",
        "fast": "p50",
        "tt-r16": "–",
        "lowrank": "size+RSS",
        "nan": "–",
    }


@pytest.mark.parametrize("x", ["file_bytes", "latency", "memory"])
def test_the_plot_is_a_png(report, tmp_path, x):
    import matplotlib.image

    path = plot_front(report, tmp_path / "plots" / f"{x}.png", x=x)
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 300 and image.shape[1] > 500
    assert np.unique(image.reshape(-1, image.shape[-1]), axis=0).shape[0] > 10  # drawn on, not blank
    assert not list(path.parent.glob(".*.tmp"))


def test_a_plot_of_an_unknown_cost_or_of_nothing_measured_is_refused(report, tmp_path):
    with pytest.raises(CompressorError, match="x axis is one of file_bytes, latency, memory"):
        plot_front(report, tmp_path / "p.png", x="params")
    report["variants"] = [row("original", 1, 1.0, math.nan, 1)]
    with pytest.raises(CompressorError, match="no variant"):
        plot_front(report, tmp_path / "p.png")
    assert not (tmp_path / "p.png").exists()


# the built-in sweep's points on a fresh clone (2026-11-27): (name, file MB, recall@10 on pydoc)
SWEEP = [
    ("original", 90.38, 1.0),
    ("original-int8", 22.97, 0.906),
    ("original-int8-aware", 23.05, 0.942),
    ("original-int4-aware", 13.92, 0.886),
    ("original-int4-trained", 15.28, 0.929),
    ("original-w4a8", 15.32, 0.927),
    ("emb4", 55.43, 0.82),
    ("emb4-int8-aware", 14.5, 0.81),
    ("emb4-int4-aware", 8.93, 0.79),
    ("emb4-int4-trained", 9.84, 0.802),
    ("emb4-w4a8", 9.87, 0.804),
    ("original-medium-w4a8", 15.2, 0.935),
    ("original-small-w4a8", 11.4, 0.907),
    ("original-3bit-linear-w4a8", 10.45, 0.853),
    ("emb8", 49.84, 0.73),
    ("emb8-int8", 13.21, 0.715),
    ("emb8-int8-aware", 13.28, 0.728),
    ("emb8-ft", 49.84, 0.803),
    ("emb8-ft-int8", 13.21, 0.789),
    ("emb8-ft-int8-aware", 13.28, 0.795),
    ("tt-r64", 45.56, 0.482),
    ("tt-r64-int8-aware", 12.03, 0.476),
    ("linear-half", 69.15, 0.653),
    ("linear-half-int8-aware", 17.84, 0.652),
    ("linear-half-int4-aware", 11.0, 0.629),
    ("all-half", 45.95, 0.708),
    ("all-half-int8-aware", 12.23, 0.707),
    ("all-half-int4-aware", 7.84, 0.673),
    ("all-half-ft", 45.95, 0.761),
    ("all-half-ft-int8-aware", 12.23, 0.751),
    ("all-half-ft-int4-aware", 7.83, 0.725),
]


def test_labels_of_near_points_do_not_overlap_and_stay_inside():
    """The built-in sweep's 31 points, crowded near 10–15 MB, where labels moved a line down at a time overlapped."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from eval.plot import _label

    fig = Figure(figsize=(8, 5.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    points = SWEEP
    ax.scatter([p[1] for p in points], [p[2] for p in points])
    ax.set_xscale("log")
    ax.autoscale_view()
    fig.tight_layout()
    _label(ax, points)
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.texts]
    assert len(boxes) == len(points)
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    inside = ax.get_window_extent()
    assert all(
        inside.x0 <= b.x0 and b.x1 <= inside.x1 + 1 and inside.y0 <= b.y0 and b.y1 <= inside.y1 + 1 for b in boxes
    )


def lm_row(name, size, ms_per_token, top1):
    """A causal LM's row: timed by decoding at two contexts (its mean ms a token `ms_per_token`), no p50."""
    contexts = {
        f"ctx{c}": {"tokens_per_s": 1e3 / ms, "per_token_p50_ms": ms}
        for c, ms in ((128, ms_per_token - 1), (512, ms_per_token + 1))
    }
    quality = {"top1_agreement": top1}
    return {**row(name, size, math.nan, math.nan, size), "latency_ms": {}, "decode_ms": contexts, "quality": quality}


def test_an_lms_latency_front_is_its_time_per_token(tmp_path):
    """An LM's rows carry no p50; their latency front and plot read the mean time per generated token."""
    report = {
        "model": "lm",
        "eval_text": "t",
        "variants": [
            lm_row("original", 400, 40.0, 1.0),
            lm_row("original-int4", 100, 10.0, 0.6),
            lm_row("slow", 100, 30.0, 0.5),
        ],
    }
    mark_pareto_(report, "top1_agreement")
    assert [r["pareto"]["latency"] for r in report["variants"]] == [True, True, False]
    assert report["pareto_axes"]["latency"].startswith("decode_ms")
    int4 = next(line for line in markdown_table(report).splitlines() if line.startswith("| original-int4 |"))
    assert "decode" in int4.split("|")[2]
    assert plot_front(report, tmp_path / "decode.png", x="latency").read_bytes()[:8] == PNG_SIGNATURE
