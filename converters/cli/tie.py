"""compressor tie MODEL --out DIR: tie a language model's output projection to its input table
(Press & Wolf), or change a tied head's score (Liu et al.), then distil the original into it."""

from pathlib import Path

from compressor.tying import SCORES
from converters.checkpoint import load_model, save_compressed
from converters.cli.options import MODEL_HELP, finetune_options
from converters.cli.specs import finetune_config, kind_options
from converters.finetune.config import FinetuneConfig
from converters.kinds import kind_of
from converters.pipeline.checks import check_kind_options
from converters.pipeline.say import say
from converters.pipeline.steps import (
    compress_and_say,
    finetune_and_say,
    finetune_texts,
    load_original,
)
from converters.plan import Plan
from converters.tying import INITS, TieConfig, check_tie
from files.atomic import check_writable

HELP = "tie a language model's output projection to its input table (or rescore a tied head), then fine-tune"

# The whole model adapts to the one table; matching the embedding's output to the untied original's
# would pull the table back towards the input side the tying just left. Ten minutes: the GPT-2-style
# LM needed 1,000 steps (486-665 s on 2 cores) to come within 5% of its untied perplexity, 300 did not.
TIE_FINETUNE = FinetuneConfig(seconds=600.0, trainable="all", layer_weight=0.0)


def add_arguments(p) -> None:
    p.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    p.add_argument(
        "--init",
        choices=INITS,
        default="input",
        help="what the shared table starts from: the input table, the output projection (Press & Wolf find the "
        "tied table resembles it; a briefly trained LM keeps less from it: BENCHMARKS.md), or their mean; ignored "
        "on a model tied already (default: input)",
    )
    p.add_argument(
        "--score",
        choices=SCORES,
        default="dot",
        help="the tied head's score (Liu et al.): dot w_iᵀh; l2, unit rows at both ends; square w_iᵀh/‖w_i‖²; "
        "distance w_iᵀh − ½‖w_i‖²; cosine w_iᵀh/‖w_i‖ (default: dot)",
    )
    p.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    finetune_options(p, run=False, defaults=TIE_FINETUNE)


def run(args) -> None:
    check_writable(args.out, "output folder")
    cfg = finetune_config(vars(args), TIE_FINETUNE)  # a bad option fails now, before the model loads
    model, source = load_original(args.model)
    check_kind_options(kind_options(vars(args)), kind_of(model))
    plan = Plan((), tie=TieConfig(args.init, args.score))
    check_tie(model, plan.tie)
    report = compress_and_say(model, plan, None)
    result = None
    if args.ft_steps != 0:
        teacher, _ = load_model(source)
        result = finetune_and_say(model, teacher, source, cfg, finetune_texts(args.data, kind_of(model)))
    save_compressed(model, plan, report, source, args.out, finetune=result)
    say(f"wrote {args.out} ({plan.label()})")
