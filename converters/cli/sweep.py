"""compressor sweep [MODEL] [--recipes FILE] --out DIR: every variant of a recipe grid made, then
all measured side by side in one bench; report.json, report.md with the Pareto-optimal rows
marked, and the fronts drawn (recall@10 against file size and against p50 latency)."""

import time
from pathlib import Path

from converters.cli.options import MODEL_HELP, bench_options, calibration_options
from converters.cli.recipes import load_recipes
from converters.cli.specs import run_spec
from converters.pipeline import measure
from converters.pipeline.say import say
from files.atomic import check_writable

HELP = "run a grid of recipes and measure them side by side; Pareto table and plots"


def add_arguments(p) -> None:
    p.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    p.add_argument(
        "--recipes",
        type=Path,
        default=None,
        help='a JSON recipe file, {"variants": [{"name": ..., "method": ..., OPTION: VALUE, ..., "quantize": '
        '["fp32", "int8", "int8-aware"]}, ...]}, the options spelled as run\'s flags (rank, dense_head, fit, '
        "budget, targets, finetune_time, lr, ...) (default: the built-in grid, converters/cli/recipes.py)",
    )
    p.add_argument("--out", type=Path, default=Path("runs/sweep"), help="output directory (default: runs/sweep)")
    calibration_options(p)
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="compute calibration statistics afresh and keep none (default: cached under $XDG_CACHE_HOME/compressor)",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="fine-tune text of the recipes that fine-tune, one passage per line (default: the finetune split of "
        "the default text)",
    )
    bench_options(p)


def run(args) -> None:
    start = time.perf_counter()
    check_writable(args.out, "output folder")
    recipes = load_recipes(args.recipes)
    variants = [r.variant(f"recipe {r.name or r.method}: {r.to_dict()}") for r in recipes]
    measure(run_spec(vars(args), variants, args.out))
    say(f"sweep of {len(recipes)} recipe(s) in {(time.perf_counter() - start) / 60:.1f} min")
