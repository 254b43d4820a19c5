"""compressor pack CKPT --out DIR: what a machine without network needs to fine-tune CKPT's plan there."""

from pathlib import Path

from converters.finetune.config import FinetuneConfig
from converters.pack import PACK_LIMIT, pack_finetune
from converters.pipeline.say import say
from files.atomic import check_writable

HELP = "pack the original in bf16, the plan, the texts and the wheels to fine-tune a checkpoint's plan elsewhere"


def add_arguments(p) -> None:
    p.add_argument("checkpoint", type=Path, help="a compressed checkpoint (its plan and original are packed)")
    p.add_argument("--out", type=Path, required=True, help="the folder to write (whole or not at all)")
    p.add_argument(
        "--time",
        type=float,
        default=FinetuneConfig().seconds,
        help="the fine-tune's seconds there, run.sh's default (default: %(default)g)",
    )
    p.add_argument(
        "--wheel",
        action="append",
        default=[],
        metavar="REQUIREMENT",
        help="another wheel the machine lacks, from this machine's package index (repeatable), e.g. tensorly==0.9.0",
    )


def run(args) -> None:
    FinetuneConfig(seconds=args.time)  # a bad time fails now
    check_writable(args.out, "pack folder")
    size = pack_finetune(args.checkpoint, args.out, args.time, args.wheel)
    say(
        f"wrote {args.out} ({size / 2**20:.1f} MiB of the {PACK_LIMIT / 2**20:.0f} a device call takes); "
        "there: sh run.sh"
    )
