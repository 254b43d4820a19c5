"""compressor run [MODEL]: compress, export and bench the original and each variant in one run."""

import copy
from pathlib import Path

from compressor.errors import ExportParityError
from converters.checkpoint import save_compressed
from converters.cli.options import MODEL_HELP, bench_options, finetune_options, method_options, quantize_option
from converters.cli.steps import (
    check_method_options,
    check_outputs,
    check_runs,
    compress_and_say,
    eval_texts,
    finetune_and_say,
    finetune_config,
    finetune_texts,
    load_original,
    plans_and_calibration,
    quantize_calibration,
    say,
)
from converters.export import export_onnx
from converters.kinds import kind_for_config
from converters.loading import DEFAULT_MODEL_NAME, resolve_model_dir
from converters.quantize import quantize_onnx
from eval.benchmark import bench
from eval.report import markdown_table, write_report

HELP = "compress, export and bench the original and each variant in one run"


def add_arguments(p) -> None:
    p.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    method_options(p, many=True)
    quantize_option(
        p,
        "also measure the original and every variant quantized with these schemes, as NAME-SCHEME (the "
        "original's int8 row, original-int8, is always there)",
        many=True,
    )
    p.add_argument("--out", type=Path, default=Path("runs/latest"), help="output directory (default: runs/latest)")
    finetune_options(p, run=True)
    bench_options(p)


def run(args) -> None:
    check_runs(args.runs)
    check_outputs(args, output_folder=args.out)
    check_method_options(args)
    source = resolve_model_dir(args.model)
    kind = kind_for_config(source)
    texts, where = eval_texts(args, kind.graph)
    schemes = list(dict.fromkeys(args.quantize or []))
    batches = quantize_calibration(args, schemes, kind.graph, source)
    fine_tune = args.ft_steps is not None or args.ft_time is not None
    if fine_tune:
        finetune_config(args)  # a bad budget or text fails now, not after the compression
        ft_texts = finetune_texts(args, kind)
        if args.ft_steps == 0:
            say("--finetune-steps 0: the fine-tune is skipped")
            fine_tune = False
    created = not args.out.exists()
    try:
        _run(args, texts, where, ft_texts if fine_tune else None, schemes, batches)
    except BaseException:
        if created and args.out.is_dir() and not any(args.out.iterdir()):
            args.out.rmdir()  # no empty folder left behind
        raise


def _run(args, texts: list[str], where: str, ft_texts, schemes: list[str], batches) -> None:
    """Compress, export and bench each variant, and each quantized with `schemes` (calibration
    `batches` for int8-aware); `ft_texts` None: no fine-tune."""
    original, source = load_original(args.model)
    out = args.out
    vocab = original.get_input_embeddings().num_embeddings
    plans, calib = plans_and_calibration(args, original, source)
    variants, details = [], []

    def add(name: str, model, detail: dict, quantize: list[str]) -> None:
        """The variant's fp32 graph, and its graph quantized with each scheme of `quantize`."""
        fp32 = export_onnx(model, out / f"{name}.onnx").path
        variants.append((name, fp32))
        details.append(detail)
        for scheme in quantize:
            try:
                result = quantize_onnx(fp32, out / f"{name}-{scheme}.onnx", vocab, scheme, batches)
            except ExportParityError as e:  # the other rows still get measured
                say(f"warning: no {name}-{scheme} row: {e}")
                continue
            variants.append((f"{name}-{scheme}", result.path))
            details.append({**detail, "quantization": {"scheme": scheme, "parity_rel_to_fp32": result.parity_rel}})

    add("original", original, {}, list(dict.fromkeys(["int8", *schemes])))  # the one-liner, in every report
    for plan in plans:
        name = plan.label()
        model = copy.deepcopy(original)
        report = compress_and_say(model, plan, calib)
        save_compressed(model, plan, report, source, out / name)
        detail = {"plan": plan.to_dict(), "compression": report.to_dict()}
        add(name, model, detail, schemes)
        if ft_texts is not None:
            result = finetune_and_say(model, original, source, args, ft_texts)
            save_compressed(model, plan, report, source, out / f"{name}-ft", finetune=result)
            add(f"{name}-ft", model, {**detail, "finetune": result}, schemes)
    model_name = DEFAULT_MODEL_NAME if args.model is None else str(source)
    report = bench(variants, source, texts, where, model=model_name, runs=args.runs)
    for row, extra in zip(report["variants"], details):
        row.update(extra)
    json_path, md_path = write_report(report, out / "report.json")
    print(markdown_table(report))
    say(f"wrote {json_path} and {md_path}")
