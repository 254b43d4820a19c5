"""compressor run [MODEL]: compress, export and bench the original and each variant in one run."""

from pathlib import Path

from converters.cli.calibrating import quantize_calibration
from converters.cli.options import (
    MODEL_HELP,
    bench_options,
    export_form_options,
    export_form_values,
    finetune_options,
    method_options,
    quantize_option,
)
from converters.cli.recipes import DEFAULT_RECIPE, with_default_recipe
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
from converters.export import check_export_forms
from converters.kinds import kind_for_config
from converters.loading import resolve_model_dir
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
    recipe = with_default_recipe(args)
    if recipe is not None:
        options = ", ".join(f"{k} {v}" for k, v in DEFAULT_RECIPE.items() if k != "name")
        say(f"no method options: the default recipe {DEFAULT_RECIPE['name']!r} ({options}; see compressor sweep)")
        args = recipe
    args.method = args.method or default_method().name
    check_runs(args.runs)
    check_int4_options(args.block_size, args.accuracy_level)
    check_correction_share(args.correction_share)
    check_table_head(args.table_head, args.quantize)
    check_outputs(args, output_folder=args.out)
    check_method_options(args)
    source = resolve_model_dir(args.model)
    kind = kind_for_config(source)
    check_kind_options(args, kind)
    texts, second = eval_texts(args, kind.graph), second_texts(args, kind.graph)
    schemes = list(dict.fromkeys(args.quantize or []))
    batches = quantize_calibration(args, [*kind.baselines, *schemes], kind.graph, source)
    fit_for = correction_fit(args, schemes, kind, source)
    fine_tune = args.ft_steps is not None or args.ft_time is not None
    if fine_tune:
        finetune_config(args)  # a bad budget or text fails now, not after the compression
        ft_texts = finetune_texts(args, kind)
        if args.ft_steps == 0:
            say("--finetune-steps 0: the fine-tune is skipped")
            fine_tune = False
    with output_folder(args.out):
        _run(args, texts, second, ft_texts if fine_tune else None, schemes, kind.baselines, batches, fit_for)


def _run(args, texts, second, ft_texts, schemes: list[str], baselines, batches, fit_for) -> None:
    """Compress, export and bench each variant, and each quantized with `schemes` (the original also with
    its kind's `baselines`; calibration
    `batches` for int8-aware, `fit_for` for int4-trained); `ft_texts` None: no fine-tune."""
    original, source = load_original(args.model)
    plans = check_plans(args, original)  # every plan against the model's modules, before the original is exported
    check_export_forms(export_form_values(args), original, plans)
    vocab = original.get_input_embeddings().num_embeddings
    int4 = (args.block_size, args.accuracy_level, args.correction_share)
    variants = Variants(args.out, source, vocab, batches, *int4, fit_for=fit_for, table_head=args.table_head)
    variants.add_original(original, [*baselines, *schemes])
    variants.add_compressed(args, original, source, ft_texts, schemes)
    variants.bench_and_report(args, source, texts, second)
