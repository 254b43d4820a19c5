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
from converters.cli.pipeline import Variant, measure
from converters.cli.recipes import DEFAULT_RECIPE, with_default_recipe
from converters.cli.steps import check_outputs, say
from converters.quantization.correction import check_correction_share
from converters.quantization.int4 import check_int4_options
from converters.quantization.quantize import check_table_head
from converters.registry import default_method

HELP = "compress, export and bench the original and each variant in one run"


def add_arguments(p) -> None:
    p.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    method_options(p, many=True)
    p.set_defaults(method=None)  # none given: the default recipe (converters/cli/recipes.py)
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
    """A sweep of one variant: the options given, or the default recipe when no method option is."""
    recipe = with_default_recipe(args)
    if recipe is not None:
        options = ", ".join(f"{k} {v}" for k, v in DEFAULT_RECIPE.items() if k != "name")
        say(f"no method options: the default recipe {DEFAULT_RECIPE['name']!r} ({options}; see compressor sweep)")
        args = recipe
    args.method = args.method or default_method().name
    check_int4_options(args.block_size, args.accuracy_level)
    check_correction_share(args.correction_share)
    check_table_head(args.table_head, args.quantize)
    check_outputs(args, output_folder=args.out)
    if args.ft_steps == 0:
        say("--finetune-steps 0: the fine-tune is skipped")
    measure(args, [Variant(args)])
