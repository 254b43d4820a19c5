"""compressor compress MODEL --out DIR: compress a model and save a compressed checkpoint."""

from pathlib import Path

from converters.checkpoint import save_compressed
from converters.cli.options import MODEL_HELP, method_options
from converters.cli.steps import (
    check_method_options,
    check_outputs,
    compress_and_say,
    load_original,
    plans_and_calibration,
    say,
)

HELP = "compress a model and save a compressed checkpoint"


def add_arguments(p) -> None:
    p.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    method_options(p, many=False)
    p.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")


def run(args) -> None:
    check_outputs(args, output_folder=args.out)
    check_method_options(args)
    model, source = load_original(args.model)
    plans, calib = plans_and_calibration(args, model, source)
    report = compress_and_say(model, plans[0], calib)
    save_compressed(model, plans[0], report, source, args.out)
    say(f"wrote {args.out} ({plans[0].label()})")
