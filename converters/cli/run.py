"""compressor run [MODEL]: compress, export and bench the original and each variant in one run."""

import json
from pathlib import Path

from compressor.errors import CompressorError
from converters.cli.catalog import builtin_recipes
from converters.cli.corrected_needs import corrected_said
from converters.cli.goals import (
    DEFAULT_GOAL,
    GOALS,
    HEAD_SHARE,
    LM_SHORTLIST,
    check_lm_run_fits,
    goal_minutes,
    goal_run,
    goal_said,
    lm_shortlist,
)
from converters.cli.options import (
    MODEL_HELP,
    bench_options,
    export_form_options,
    finetune_options,
    method_options,
    quantize_option,
    shown_alone,
)
from converters.cli.recipes import default_run
from converters.cli.specs import run_spec, variant_spec
from converters.kinds import kind_for_config
from converters.loading import resolve_model_dir
from converters.pipeline import measure
from converters.pipeline.measuring import original_rows
from converters.pipeline.say import say
from converters.quantization.kv_cache import CACHE_TYPES
from eval.kinds import CAUSAL_LM
from files.atomic import check_writable

HELP = "compress, export and bench the original and each variant in one run"
# The options `run --help` lists; the others (a method's, a scheme's, the fine-tune's settings) are still taken, as
# overrides of the goal's or recipe's settings, for one release
SHOWN = (
    "--goal",
    "--recipe",
    "--out",
    "--method",
    "--rank",
    "--targets",
    "--budget",
    "--plan",
    "--quantize",
    "--target-cpu",
    "--calib",
    "--data",
    "--eval-text",
    "--second-text",
    "--runs",
    "--finetune-time",
    "--finetune-device",
    "--no-cache",
)


def add_arguments(p) -> None:
    p.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    method_options(p, many=True)  # none given: the default run (converters/cli/recipes.py)
    quantize_option(
        p,
        "also measure the original and every variant quantized with these schemes, as NAME-SCHEME (the "
        "original's int8 row, original-int8, is always there)",
        many=True,
    )
    export_form_options(p, many=True)
    p.add_argument("--out", type=Path, default=Path("runs/latest"), help="output directory (default: runs/latest)")
    p.add_argument(
        "--goal",
        choices=tuple(GOALS),
        default=None,
        help=f"what the row to deploy is chosen for, measured on this model and CPU against original-int8: "
        f"{'; '.join(f'{name}: {goal.deploys}' for name, goal in GOALS.items())} (default: {DEFAULT_GOAL}; compressor "
        "recipes lists each goal's rows)",
    )
    p.add_argument(
        "--recipe",
        default=None,
        metavar="NAME|FILE",
        help="run a built-in recipe (compressor recipes lists them) or a JSON recipe file instead of the goal's rows",
    )
    finetune_options(p, run=True)
    p.add_argument(
        "--kv-cache",
        choices=CACHE_TYPES,
        default="int8",
        help="a causal LM's quantized rows' key-value cache where their graph is the fused decoder: int8, a scale "
        "per head and channel from the calibration text (a quarter of the bytes each generated token reads again), "
        "or fp32 (default: int8; the fp32 rows keep theirs in fp32)",
    )
    p.add_argument(
        "--shortlist",
        type=int,
        default=None,
        metavar="K",
        help=f"a causal LM's w8 and int4 rows also measured with a shortlist head, their decoding steps scoring "
        f"exactly the K best of a rank-{LM_SHORTLIST[1]} fit of the head (default: {LM_SHORTLIST[0]}, at most a "
        f"quarter of the vocabulary, where the tied head is {HEAD_SHARE:.0%} of the weights or more, "
        "else none; 0: none)",
    )
    bench_options(p)
    shown_alone(p, SHOWN)


def run(args) -> None:
    """A sweep of one variant, the options given; or, when no method option is, a goal's rows (goals.goal_run) or a
    recipe's: argv → one spec (the options not given read from the configs) → measure."""
    values = vars(args)
    values["goal"] = goal = args.goal or DEFAULT_GOAL
    recipes, source = _recipes_of(args.recipe, goal)
    model_dir = resolve_model_dir(args.model)
    kind = kind_for_config(model_dir)
    variants = default_run(values, kind, recipes, source, strict=args.recipe is not None)
    if args.recipe is not None and (variants is None or args.quantize):
        raise CompressorError(
            f"--recipe runs {source} in place of method options and --quantize: give one or the other"
        )
    values["shortlist_rows"] = lm_shortlist(model_dir, kind.name, args.shortlist)
    if variants is not None and args.quantize:
        say(f"no method options: the original in {' and '.join(args.quantize)}")
    elif variants == []:
        rows = ", ".join(kind.baselines)
        shortlist = values["shortlist_rows"]
        needs = check_lm_run_fits(model_dir, kind.baselines, shortlist) if kind.name == "causal-lm" else None
        say(f"no method options: the original's rows ({rows}{f': {needs}' if needs else ''}); {source} is an encoder's")
    elif variants is not None and args.recipe:
        say(f"{source}, beside original-int8; deploy {GOALS[goal].deploys}")
    elif variants is not None:
        minutes, pace = goal_minutes(goal, model_dir)
        say(f"goal {goal}: {goal_said(goal)} (about {minutes} minutes for a model of this size, {pace})")
    else:
        variants = [variant_spec(values)]
    spec = run_spec(values, variants, args.out)
    if kind.graph is CAUSAL_LM:  # a corrected row's time and peak, refused before any work where it does not fit
        rows = [*original_rows(spec, kind.baselines).schemes, *(c for v in spec.variants for c in v.quantize.schemes)]
        for needs in corrected_said(model_dir, rows):
            say(needs)
    check_writable(args.out, "output folder")
    if args.ft_steps == 0:
        say("--finetune-steps 0: the fine-tune is skipped")
    measure(spec)


def _recipes_of(recipe: str | None, goal: str) -> tuple[dict, str]:
    """(the recipe file's content a run makes, what to call it): the goal's rows, a built-in recipe by name, or a
    JSON recipe file; a name that is neither is refused, the built-in ones listed."""
    if recipe is None:
        return goal_run(goal), f"goal {goal}"
    known = builtin_recipes()
    if recipe in known:
        return {"variants": [known[recipe]]}, f"recipe {recipe!r}"
    path = Path(recipe)
    if not path.is_file():
        raise CompressorError(f"--recipe is a built-in recipe ({', '.join(known)}) or a recipe file; got {recipe!r}")
    try:
        return json.loads(path.read_text(encoding="utf-8")), f"recipe file {recipe!r}"
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CompressorError(
            f'{recipe!r} is not JSON ({e}); a recipe file is an object with a "variants" list'
        ) from None
