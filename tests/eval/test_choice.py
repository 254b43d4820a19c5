"""The row to deploy (eval/choice.py): the smallest file that beats original-int8 on every axis; else the smallest
as cheap as int8 that keeps its recall, near sizes counted equal and the better recall taken; never a row off its
gate."""

import pytest

from eval.choice import choose
from eval.report import markdown_table

MB, MIB = 1_000_000, 2**20


def row(name, file_mb, rss_mib, p50_short, p50_long, recall, recall_2nd, **extra):
    return {
        "name": name,
        "params": 1,
        "file_bytes": int(file_mb * MB),
        "optimized_initializer_bytes": int(file_mb * MB),
        "peak_rss_bytes": int(rss_mib * MIB),
        "baseline_rss_bytes": 60 * MIB,
        "latency_ms": {"b1_s16_t1": {"p50": p50_short}, "b8_s128_t2": {"p50": p50_long}},
        "quality": {"recall_at_10": recall},
        "quality_second_text": {"recall_at_10": recall_2nd},
        **extra,
    }


def report(*rows):
    return {"model": "m", "eval_text": "t", "variants": [row("original", 90, 200, 6.0, 160.0, 1.0, 1.0), *rows]}


INT8 = row("original-int8", 23, 123, 1.8, 80.0, 0.906, 0.915)


def test_the_smallest_file_that_beats_int8_on_every_axis_is_chosen():
    chosen = choose(
        report(
            INT8,
            row("small", 11, 120, 1.7, 79.0, 0.90, 0.91),  # half int8's file or less, no dearer, recall within 0.01
            row("smaller", 9, 120, 1.7, 79.0, 0.85, 0.91),  # loses recall on the first text
            row("tiny-but-heavy", 8, 224, 1.7, 79.0, 0.95, 0.95),  # more memory
        )
    )
    assert chosen["row"] == "small" and chosen["rule"] == "beats int8"
    assert "0.48× int8's file" in chosen["why"]


def test_without_one_the_smallest_as_cheap_as_int8_with_its_recall_the_better_recall_at_one_size():
    chosen = choose(
        report(
            INT8,
            row("original-int8-aware", 23.05, 123, 1.8, 81.0, 0.942, 0.948),  # 0.3 % larger: one size with int8
            row("original-small-w4a8", 11.4, 224, 2.1, 123.0, 0.909, 0.896),  # memory, speed and news recall lost
            row("slow", 15, 120, 1.9, 90.0, 0.95, 0.95),  # 12 % slower at (8,128)
        )
    )
    assert chosen["row"] == "original-int8-aware" and chosen["rule"] == "as cheap as int8"
    assert chosen["why"].startswith("no row beats original-int8 on every axis on this CPU")


def test_int8_itself_when_nothing_else_qualifies_and_never_a_row_off_its_gate():
    failed = row("off-gate", 5, 100, 1.0, 50.0, 0.99, 0.99, gate_failed="the int8 graph … is off its fp32 graph")
    assert choose(report(INT8, failed))["row"] == "original-int8"


def test_an_int8_row_off_its_gate_is_the_measure_but_not_a_choice():
    off = row("original-int8", 23, 123, 1.8, 80.0, 0.60, 0.55, gate_failed="off by 0.595")
    aware = row("original-int8-aware", 23, 123, 1.8, 80.0, 0.92, 0.90)
    assert choose(report(off, aware))["row"] == "original-int8-aware"
    assert choose(report(off))["row"] is None


def test_in_place_of_an_int8_off_its_gate_the_fastest_row_no_larger_in_file_and_memory():
    """The 110M MPNet of issue 62: int8 off its gate, no row within 3 % of its p50 (1.46× at (1,16) t1)."""
    off = row("original-int8", 110.08, 230, 8.66, 753.4, 0.728, 0.795, gate_failed="off by 0.595")
    rows = (
        row("original-int8-aware", 110.36, 231, 12.67, 753.2, 0.922, 0.908),  # 0.3 % larger: one size with int8
        row("original-int4-aware", 66.70, 234, 13.48, 1424.0, 0.892, 0.902),
        row("original-table3", 97.74, 219, 9.02, 790.6, 0.916, 0.903),
        row("heavy", 60.0, 300, 5.0, 500.0, 0.95, 0.95),  # the fastest, but more memory than int8
    )
    chosen = choose(report(off, *rows))
    assert (chosen["row"], chosen["rule"]) == ("original-int8-aware", "in int8's place")
    assert chosen["why"].startswith("original-int8 is off its gate and no row is as cheap as it")
    assert choose(report({**off, "gate_failed": None}, *rows))["row"] == "original-int8"  # on its gate: itself


ROWS = (
    INT8,
    row("aware", 23, 123, 1.8, 80.0, 0.942, 0.948),
    row("table3", 16.8, 117, 1.85, 81.0, 0.931, 0.924),
    row("w4a8", 11.4, 224, 2.1, 123.0, 0.909, 0.896),  # within 0.05 of int8's recall, the least file
    row("lean", 14, 110, 1.7, 90.0, 0.90, 0.91),  # the least memory, slower
    row("quick", 30, 130, 1.2, 60.0, 0.90, 0.91),  # the fastest, larger than int8
)


@pytest.mark.parametrize(
    "goal, chosen",
    [("balanced", "table3"), ("size", "w4a8"), ("memory", "lean"), ("latency", "quick"), ("quality", "aware")],
)
def test_each_goal_picks_its_row(goal, chosen):
    choice = choose(report(*ROWS), goal)
    assert (choice["goal"], choice["row"]) == (goal, chosen)


@pytest.mark.parametrize("rows", [(), (row("original-int8", 23, 123, 1.8, 80.0, 0.9, None),)])
def test_no_choice_without_a_measured_int8_row(rows):
    r = report(*rows)
    if rows:
        del r["variants"][1]["quality_second_text"]
    assert choose(r) is None


def test_the_report_says_the_choice_in_a_sentence():
    r = report(INT8, row("small", 11, 120, 1.7, 79.0, 0.90, 0.91))
    r["choice"] = choose(r)
    assert "**deploy small** (goal balanced: beats int8): small beats original-int8 on every axis" in markdown_table(r)
