"""compressor sweep [MODEL] [--recipes FILE] --out DIR: every variant of a recipe grid made, then
all measured side by side in one bench; report.json, report.md with the Pareto-optimal rows
marked, and the fronts drawn (recall@10 against file size and against p50 latency)."""

import time
from pathlib import Path

from converters.cli.calibrating import quantize_calibration
from converters.cli.options import MODEL_HELP, bench_options, calibration_options
from converters.cli.recipes import load_recipes
from converters.cli.steps import (
    check_kind_options,
    check_method_options,
    check_outputs,
    check_plans,
    check_runs,
    correction_fit,
    eval_texts,
    finetune_config,
    finetune_texts,
    load_original,
    say,
    second_texts,
)
from converters.cli.variants import Variants, output_folder
from converters.kinds import kind_for_config
from converters.loading import resolve_model_dir

HELP = "run a grid of recipes and measure them side by side; Pareto table and plots"


def add_arguments(p) -> None:
    p.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    p.add_argument(
        "--recipes",
        type=Path,
        default=None,
        help='a JSON recipe file, {"variants": [{"name": ..., "method": ..., OPTION: VALUE, ..., "quantize": '
        '["fp32", "int8", "int8-aware"]}, ...]}, the options spelled as run\'s flags (rank, dense_head, kind, '
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


def _fine_tunes(args) -> bool:
    return (args.ft_steps is not None or args.ft_time is not None) and args.ft_steps != 0


def run(args) -> None:
    start = time.perf_counter()
    check_runs(args.runs)
    check_outputs(args, output_folder=args.out)
    recipes = load_recipes(args.recipes)
    spaces = [r.namespace(args) for r in recipes]
    for space in spaces:
        check_method_options(space)  # the cache folder, now that --no-cache is known
        if _fine_tunes(space):
            finetune_config(space)
    source = resolve_model_dir(args.model)
    kind = kind_for_config(source)
    for space in spaces:
        check_kind_options(space, kind)
    texts, second = eval_texts(args, kind.graph), second_texts(args, kind.graph)
    schemes = list(dict.fromkeys(s for space in spaces for s in space.quantize or []))
    batches = quantize_calibration(args, [*kind.baselines, *schemes], kind.graph, source)
    fit_for = correction_fit(args, schemes, kind, source)
    ft_texts = finetune_texts(args, kind) if any(_fine_tunes(s) for s in spaces) else None
    with output_folder(args.out):
        original, source = load_original(args.model)
        for space in spaces:
            check_plans(space, original)  # every recipe's plan fits the model before anything is exported
        vocab = original.get_input_embeddings().num_embeddings
        variants = Variants(args.out, source, vocab, batches, fit_for=fit_for)
        variants.add_original(original, [*kind.baselines, *schemes])
        for recipe, space in zip(recipes, spaces):
            say(f"recipe {recipe.name or recipe.method}: {recipe.to_dict()}")
            fp32 = "fp32" in recipe.quantize
            tuned = ft_texts if _fine_tunes(space) else None
            variants.add_compressed(space, original, source, tuned, space.quantize or [], recipe.name, fp32=fp32)
        variants.bench_and_report(args, source, texts, second)
    say(f"sweep of {len(recipes)} recipe(s) in {(time.perf_counter() - start) / 60:.1f} min")
