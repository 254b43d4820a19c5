"""The command line, one module per command: compress, tie, finetune, export, bench, generate, run, sweep, recipes
(catalog.py). The only
place that wires compressor, converters and eval together; it names no method and no model kind
(it reads the method registry and the kind adapters)."""

import argparse
import os
import signal
import threading

from compressor.errors import CompressorError
from converters.cli import bench, catalog, compress, export, finetune, generate, pack, run, sweep, tie
from converters.distributed import world
from converters.pipeline.say import say

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


def _terminated(signum, frame):
    """SIGTERM (how a container or a job scheduler stops a run) ends it as Ctrl-C does: KeyboardInterrupt unwinds
    every half-written output back off its final name."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()  # where Python lets a handler be set
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        if world().size > 1 and args.command != "finetune":
            raise CompressorError(
                f"under torchrun only compressor finetune runs (one process per share of each batch); run "
                f"{args.command} in one process"
            )
        COMMANDS[args.command].run(args)
    except CompressorError as e:
        say(f"error: {e}")
        return getattr(e, "exit_code", 2)  # 2: bad input; 1: the machine (a full disk)
    except KeyboardInterrupt:
        say("interrupted; outputs not yet complete were not written under their final names")
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    return 0
