"""compressor run [MODEL]: compress, export and bench the original and each variant in one run."""

from pathlib import Path

from converters.cli.options import (
    MODEL_HELP,
    bench_options,
    export_form_options,
    finetune_options,
    method_options,
    quantize_option,
)
from converters.cli.recipes import DEFAULT_RECIPE, default_run
from converters.cli.specs import run_spec, variant_spec
from converters.kinds import kind_for_config
from converters.loading import resolve_model_dir
from converters.pipeline import measure
from converters.pipeline.say import say
from files.atomic import check_writable

HELP = "compress, export and bench the original and each variant in one run"


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
    finetune_options(p, run=True)
    bench_options(p)


def run(args) -> None:
    """A sweep of one variant, the options given; or, when no method option is, the default run (DEFAULT_RUN):
    argv → one spec (the options not given read from the configs) → measure."""
    values = vars(args)
    kind = kind_for_config(resolve_model_dir(args.model))
    variants = default_run(values, kind)
    if variants is not None and args.quantize:
        say(f"no method options: the original in {' and '.join(args.quantize)}")
    elif variants == []:
        say(
            f"no method options: the original's rows ({', '.join(kind.baselines)}); the default recipe "
            f"{DEFAULT_RECIPE['name']!r} is an encoder's (w4a8 and a 3-bit table)"
        )
    elif variants is not None:
        options = ", ".join(f"{k} {v}" for k, v in DEFAULT_RECIPE.items() if k not in ("name", "method"))
        say(
            f"no method options: the default recipe {DEFAULT_RECIPE['name']!r}, the original quantized ({options}), "
            "beside original-int8-aware and original-int4-aware (see compressor sweep)"
        )
    else:
        variants = [variant_spec(values)]
    spec = run_spec(values, variants, args.out)
    check_writable(args.out, "output folder")
    if args.ft_steps == 0:
        say("--finetune-steps 0: the fine-tune is skipped")
    measure(spec)
