"""The command line's parser and entry: every command's subparser (COMMANDS, one module each) and `main`, which runs
the command and turns its end into an exit status (pipeline/ending.py)."""

import argparse
import os

from compressor.errors import CompressorError
from converters.cli import bench, catalog, compress, export, finetune, generate, pack, run, sweep, tie
from converters.pipeline.ending import ended
from converters.torchrun import world

__all__ = ["main", "build_parser", "COMMANDS"]

COMMANDS = {
    "compress": compress,
    "tie": tie,
    "finetune": finetune,
    "pack": pack,
    "export": export,
    "bench": bench,
    "generate": generate,
    "run": run,
    "sweep": sweep,
    "recipes": catalog,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compressor",
        description="Post-training compression of trained NLP models: compress, export to ONNX, benchmark.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        command.add_arguments(sub.add_parser(name, help=command.HELP))
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command `argv` (None: this process's own command line), its exit status."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    args = build_parser().parse_args(argv)

    def work() -> None:
        if world().size > 1 and args.command != "finetune":
            raise CompressorError(
                f"under torchrun only compressor finetune runs (one process per share of each batch); run "
                f"{args.command} in one process"
            )
        COMMANDS[args.command].run(args)

    return ended(work)
