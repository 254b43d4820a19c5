"""compressor compress MODEL --out DIR: compress a model and save a compressed checkpoint."""

from pathlib import Path

from converters.cli.options import MODEL_HELP, method_options
from converters.cli.specs import method_spec, text_spec
from converters.pipeline import compress_checkpoint
from converters.pipeline.say import say
from files.atomic import check_writable

HELP = "compress a model and save a compressed checkpoint"


def add_arguments(p) -> None:
    p.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    method_options(p, many=False)
    p.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")


def run(args) -> None:
    spec, texts = method_spec(vars(args)), text_spec(vars(args))
    check_writable(args.out, "output folder")
    plan = compress_checkpoint(args.model, spec, texts, args.out)
    say(f"wrote {args.out} ({plan.label()})")
