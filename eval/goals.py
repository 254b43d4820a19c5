"""The goals of `compressor run --goal`, each a registered preset: the rows it measures on the user's model beside
original-int8 (what the user would do otherwise) — schemes of the original and built-in recipes, by name
(converters/cli/builtin_recipes.py) — the rule that picks the row to deploy on the CPU the report was measured on
(eval.choice for an encoder's report, eval.lm_choice for a causal LM's, whose rows are its kind's own), and the
committed record of the run its time is said from (benchmarks/results/scale/, scaled by eval.pace).

The rows, measured on MiniLM and a 110M MPNet (docs/lab-notes/2026-11-28-deployment.md):
- balanced (the default): int8-aware, int8-w4 (4-bit weights multiplied in int8: on MiniLM 0.48× int8's file, 0.95×
  its peak RSS, its p50 within the noise) and the word table in 3 bits beside int8-aware's products;
- size: int4-aware, the 3-bit table and the 4-bit w4a8 recipe (0.126× on MiniLM, trained 240 s);
- memory: int8-aware, int4-aware and the 3-bit table (the least memory that keeps int8's recall);
- latency: int8-aware (as fast as int8, and the recall smoothing buys);
- quality: int8-aware and the word table in 4 bits (its frequent rows in 8).
w4a8 is measured for size alone: its codes become int8 weights when the session starts (1.8× int8's peak memory on
MiniLM), so by the other goals' rules it cannot win."""

from dataclasses import dataclass

from eval.choice import choose_encoder
from eval.lm_choice import choose_lm, is_lm_report

__all__ = ["Goal", "GOALS", "DEFAULT_GOAL", "choose"]


@dataclass(frozen=True)
class Goal:
    """A goal: `deploys`, its rule in words (the rule itself: eval.choice.RULES[name], eval.lm_choice.LM_RULES[name]);
    `schemes`, the original's rows beside original-int8, and `recipes`, the built-in recipes measured beside them;
    `estimate`, the key of the run that times it in the scale record (converters/cli/goals.py reads it)."""

    name: str
    deploys: str
    schemes: tuple[str, ...]
    recipes: tuple[str, ...]
    estimate: str


GOALS = {
    goal.name: goal
    for goal in (
        Goal(
            "balanced",
            "the smallest file as cheap as original-int8 that keeps its recall",
            ("int8-aware", "int8-w4"),
            ("original-table3",),
            "all-MiniLM-L6-v2 balanced",
        ),
        Goal(
            "size",
            "the smallest file within 0.05 of original-int8's recall",
            ("int4-aware",),
            ("original-table3", "original-small"),
            "all-MiniLM-L6-v2 size",
        ),
        Goal(
            "memory",
            "the least peak RSS that keeps original-int8's recall",
            ("int8-aware", "int4-aware"),
            ("original-table3",),
            "all-MiniLM-L6-v2 memory",
        ),
        Goal(
            "latency",
            "the least p50 at (8,128) on two threads that keeps original-int8's recall",
            ("int8-aware",),
            (),
            "all-MiniLM-L6-v2 latency",
        ),
        Goal(
            "quality",
            "the best recall no larger and no dearer than original-int8",
            ("int8-aware",),
            ("original-table4",),
            "all-MiniLM-L6-v2 quality",
        ),
    )
}
DEFAULT_GOAL = "balanced"


def choose(report: dict, goal: str = DEFAULT_GOAL) -> dict | None:
    """{"goal", "row", "rule", "why", "against"} of the report's row to deploy for `goal`: a causal LM's report
    (timed by decoding) by eval.lm_choice's rule, an encoder's by eval.choice's; None where the row it is measured
    against lacks a figure."""
    if is_lm_report(report):
        return choose_lm(report, goal)
    return choose_encoder(report, goal, GOALS[goal].deploys)
