"""The options of tools/train_lm.py, the LMs `make lm` trains: what each is, its default and its --tiny value
(`Options`, `TINY`, `HELP`), read from the command line (`parse`: a default, then --tiny's, then what is given), and
checked before any work (`validate`: CompressorError, one sentence, for the first that cannot work)."""

import argparse
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from compressor.errors import CompressorError
from files.atomic import check_writable

__all__ = ["ARCHS", "EOT", "EVAL_MAX_LENGTH", "Options", "TINY", "parse", "validate"]

ARCHS = ("gpt2", "lstm")
LSTM_LAYERS = 2  # --n-layer of --arch lstm unless given

EOT = "<|endoftext|>"  # GPT-2's one special token: bos, eos, pad and unk
EVAL_MAX_LENGTH = 128  # tokens per eval passage, as the toolkit measures


@dataclass(frozen=True)
class Options:
    arch: str = "gpt2"  # gpt2 (a GPT2LMHeadModel) or lstm (tools/lstm_lm.py)
    vocab: int = 16384  # BPE vocabulary, special token included; large, so that the table dominates
    n_embd: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_positions: int = 256  # learned positions: room for 128-token windows and more
    dropout: float = 0.1
    untied: bool = False
    batch: int = 16  # windows per step
    block: int = 128  # tokens per window
    lr: float = 2e-3  # peak learning rate, after the warmup
    warmup: int = 50  # steps of linear warmup
    weight_decay: float = 0.1  # on matrices only (the tables included), not on biases and LayerNorms
    steps: int | None = None  # stop after this many steps (None: the time budget alone)
    minutes: float = 12.0  # stop the training loop after this many minutes
    max_passages: int | None = None  # train on the first N train passages only (None: all)
    eval_passages: int | None = None  # held-out passages for the final perplexity (None: all 292)
    seed: int = 0


# --tiny: a model trained in seconds, for tests; any option given on the command line still wins.
TINY = {
    "vocab": 512,
    "n_embd": 32,
    "n_layer": 1,
    "n_head": 2,
    "n_positions": 128,
    "batch": 4,
    "block": 64,
    "warmup": 2,
    "steps": 20,
    "max_passages": 300,
    "eval_passages": 16,
}

HELP = {
    "vocab": "BPE vocabulary size, <|endoftext|> included (at least 257: 256 bytes and the special token)",
    "n_embd": "width of the model: the embedding table is vocab × n_embd",
    "n_layer": "transformer blocks",
    "n_head": "attention heads; must divide n_embd",
    "n_positions": f"learned positions; at least --block and {EVAL_MAX_LENGTH} (the eval length)",
    "dropout": "dropout of the embeddings, residuals and attention, in [0, 1)",
    "batch": "windows per step",
    "block": "tokens per window",
    "lr": "peak learning rate of AdamW, reached after the warmup, then cosine decay to a tenth of it",
    "warmup": "steps of linear warmup",
    "weight_decay": "AdamW weight decay, on matrices (the tables included) only",
    "steps": "stop after this many steps (the schedule then ends at that step)",
    "minutes": "stop the training loop after this many minutes (the schedule ends then); tokenizer, eval and "
    "saving come on top, about a minute at the default sizes",
    "max_passages": "train on the first N passages of the train split only (all when not given)",
    "eval_passages": "held-out passages for the final perplexity (all 292 when not given; 0: none)",
    "seed": "seed of the initialisation, the windows and dropout",
}


NOT_OPTIONS = ("untied", "arch")  # given as their own flags


def parse(argv: list[str] | None, description: str) -> tuple[Options, Path, bool]:
    """(options, output folder, --force) from the command line; `description`: the command's, for --help."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True, help="output folder (refused if it exists, unless --force)")
    parser.add_argument(
        "--force", action="store_true", help="replace --out if it exists (only once the new one is whole)"
    )
    parser.add_argument("--untied", action="store_true", help="separate input and output tables, both trained")
    parser.add_argument("--tiny", action="store_true", help=f"tiny defaults for tests: {TINY}")
    parser.add_argument(
        "--arch",
        choices=ARCHS,
        default="gpt2",
        help="gpt2: a GPT-2-style transformer (Hugging Face); lstm: a Press & Wolf LSTM LM, a plain PyTorch "
        f"module (tools/lstm_lm.py; --n-layer {LSTM_LAYERS} unless given) (default: gpt2)",
    )
    for field in dataclasses.fields(Options):
        if field.name in NOT_OPTIONS:
            continue
        kind = float if field.name in ("dropout", "lr", "weight_decay", "minutes") else int
        parser.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=kind,
            default=None,
            metavar="N" if kind is int else "X",
            help=f"{HELP[field.name]} (default: {field.default}"
            + (f"; --tiny: {TINY[field.name]})" if field.name in TINY else ")"),
        )
    args = parser.parse_args(argv)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(Options) if f.name not in NOT_OPTIONS}
    defaults = {**({"n_layer": LSTM_LAYERS} if args.arch == "lstm" else {}), **(TINY if args.tiny else {})}
    chosen = {k: v if v is not None else defaults.get(k, getattr(Options, k)) for k, v in given.items()}
    return Options(**chosen, untied=args.untied, arch=args.arch), args.out, args.force


def validate(opts: Options, out: Path, force: bool) -> None:
    """CompressorError, one sentence, for the first option that cannot work; nothing is done before."""
    for name in ("vocab", "n_embd", "n_layer", "n_head", "n_positions", "batch", "block", "steps", "max_passages"):
        value = getattr(opts, name)
        if value is not None and value <= 0:
            raise CompressorError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    for name in ("warmup", "eval_passages", "seed"):
        value = getattr(opts, name)
        if value is not None and value < 0:
            raise CompressorError(f"--{name.replace('_', '-')} must be 0 or more, got {value}")
    for name in ("lr", "minutes"):
        value = getattr(opts, name)
        if not (value > 0 and math.isfinite(value)):
            raise CompressorError(f"--{name} must be a positive number, got {value}")
    if not (0 <= opts.weight_decay < math.inf):
        raise CompressorError(f"--weight-decay must be 0 or more, got {opts.weight_decay}")
    if not 0 <= opts.dropout < 1:
        raise CompressorError(f"--dropout must be in [0, 1), got {opts.dropout}")
    if opts.vocab < 257:
        raise CompressorError(f"--vocab must be at least 257 (256 bytes and {EOT}), got {opts.vocab}")
    if opts.arch == "gpt2" and opts.n_embd % opts.n_head:
        raise CompressorError(f"--n-embd must be divisible by --n-head, got {opts.n_embd} and {opts.n_head}")
    if opts.n_positions < max(opts.block, EVAL_MAX_LENGTH):
        raise CompressorError(
            f"--n-positions must be at least --block and {EVAL_MAX_LENGTH} (the eval length), got {opts.n_positions} "
            f"with --block {opts.block}"
        )
    if out.exists() and not force:
        raise CompressorError(f"the output folder {str(out)!r} exists; remove it, pick another --out, or give --force")
    check_writable(out, "output folder")
