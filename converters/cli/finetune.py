"""compressor finetune DIR: distil the original model into a compressed checkpoint, in place."""

from pathlib import Path

from compressor.errors import CompressorError
from converters.checkpoint import load_model, read_meta, save_compressed
from converters.cli.options import finetune_options
from converters.cli.specs import FINETUNE_DEFAULTS, finetune_config, kind_options
from converters.compress import CompressionReport
from converters.distributed import SHARD_ALONE, check_shares
from converters.finetune import FinetuneRun
from converters.finetune.state import check_resumable
from converters.kinds import kind_named, kind_of
from converters.pipeline.checks import check_kind_options
from converters.pipeline.say import say
from converters.pipeline.steps import finetune_and_say, finetune_texts
from converters.plan import Plan
from converters.torchrun import world
from files.atomic import check_writable

HELP = "distil the original model into a compressed checkpoint, in place"


def add_arguments(p) -> None:
    p.add_argument("checkpoint", type=Path, help="compressed checkpoint directory (written by compress)")
    finetune_options(p, run=False)
    p.add_argument(
        "--state",
        type=Path,
        default=None,
        help=f"save the fine-tune's state to this file every {FINETUNE_DEFAULTS.eval_every} steps (each validation) "
        "and when stopped (Ctrl-C, SIGTERM), so that --resume can go on from it (default: not saved)",
    )
    p.add_argument(
        "--shard",
        action="store_true",
        help="under torchrun, split the student and the teacher over the processes with FSDP (each holds 1/N of "
        "every weight, gradient and optimizer state) instead of a whole student on each: for a model too large "
        "for one device",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="go on from the state in --state: the same checkpoint, settings and budget, to the result of the run "
        "unstopped",
    )


def run(args) -> None:
    meta = read_meta(args.checkpoint)
    check_writable(args.checkpoint, "checkpoint folder")
    check_kind_options(kind_options(vars(args)), kind_named(meta.get("kind", "encoder")))
    cfg = finetune_config(vars(args))  # a bad option fails now, before two models load
    if args.shard and world().size == 1:
        raise CompressorError(SHARD_ALONE)
    check_shares(cfg.with_batch(kind_named(meta.get("kind", "encoder"))).batch_size, "windows in a batch")
    if args.resume and args.state is None:
        raise CompressorError("--resume goes on from a fine-tune state: give its file with --state")
    if args.resume:
        check_resumable(args.state)
    if args.state is not None and not args.resume and args.state.exists():
        raise CompressorError(f"{str(args.state)!r} is there: --resume goes on from it, or give a new file")
    if args.state is not None:
        check_writable(args.state, "fine-tune state file")
    teacher_dir = Path(meta["source"])
    if not (teacher_dir / "config.json").is_file():
        raise CompressorError(
            f"the original model {str(teacher_dir)!r} that {str(args.checkpoint)!r} was compressed from "
            "cannot be found; the fine-tune distils from it"
        )
    student, _ = load_model(args.checkpoint)
    teacher, _ = load_model(teacher_dir)
    if cfg.steps == 0:
        say("--steps 0: nothing to fine-tune; the checkpoint is unchanged")
        return
    texts = finetune_texts(args.data, kind_of(student))
    run_as = FinetuneRun(state=args.state, resume=args.resume, sharded=args.shard)
    result = finetune_and_say(student, teacher, teacher_dir, cfg, texts, run_as)
    if not world().main:  # under torchrun the first process writes
        return
    plan = Plan.from_dict(meta["plan"])
    report = CompressionReport(**meta["report"])
    save_compressed(student, plan, report, teacher_dir, args.checkpoint, finetune=result)
    say(f"wrote {args.checkpoint}")
