"""compressor recipes: the built-in recipes (what `compressor run --recipe NAME` runs and the goals are made of),
one line each on what it is for, and the goals (`compressor run --goal`)."""

from converters.cli.builtin_recipes import builtin_recipes
from converters.cli.goals import DEFAULT_GOAL, GOALS, goal_said

__all__ = ["HELP", "PURPOSES", "builtin_recipes", "add_arguments", "run"]

HELP = "list the built-in recipes (compressor run --recipe NAME) and the goals (--goal)"
# What each built-in recipe is for, in a line (the figures: MiniLM on the project's AVX-512 VNNI CPU; docs/)
PURPOSES = {
    "original-table3": "int8's products, the word table in 3 bits: less file and memory than int8, more recall",
    "original-table4": "int8's products, the word table in 4 bits (its frequent rows in 8): int8-aware's recall",
    "original-small": "w4a8, half of int8's file (0.126×); 1.8× int8's peak memory at session start",
    "original-medium": "w4a8 at int4-aware's bytes (0.168×) with int8-aware's recall; trained 480 s",
    "original-3bit-linear": "w4a8 with the linear layers in 3 bits too (0.114×)",
    "original-tiny": "the smallest file (0.090×), recall@10 about 0.85 / 0.81",
    "emb4": "the word table low-rank at a quarter (its frequent rows exact), then rounded",
    "emb8": "the word table as a tensor train (rank 150), fine-tuned 150 s",
    "tt-r64": "the word table as a rank-64 tensor train",
    "linear-half": "the linear layers low-rank at half their parameters",
    "all-half": "every layer low-rank at half the parameters, fine-tuned",
}


def _line(recipe: dict) -> str:
    schemes = ", ".join(recipe.get("quantize", ()))
    return f"  {recipe['name']:22} {PURPOSES.get(recipe['name'], '')} [{recipe['method']}: {schemes}]"


def add_arguments(p) -> None:
    p.description = __doc__.splitlines()[0]


def run(args) -> None:
    print("recipes (compressor run MODEL --recipe NAME, or a JSON file of them: compressor sweep --help):")
    print("\n".join(_line(recipe) for recipe in builtin_recipes().values()))
    print(f"\ngoals (compressor run MODEL --goal GOAL; default {DEFAULT_GOAL}):")
    print("\n".join(f"  {goal:9} {goal_said(goal)}" for goal in GOALS))
