"""compressor export MODEL [--out DIR]: a model or checkpoint to a ready model folder (files.model_folder)
whose ONNX graph is parity-checked; --out FILE.onnx writes the graph alone."""

import contextlib
import tempfile
from pathlib import Path

from compressor.errors import CompressorError
from converters.calibration import Calibration, token_counts
from converters.checkpoint import load_model
from converters.cli.calibrating import quantize_calibration
from converters.cli.options import (
    calibration_options,
    data_option,
    export_form_options,
    export_form_values,
    prior_options,
    quantize_option,
)
from converters.cli.steps import check_outputs, correction_fit, say
from converters.export import export_form_rows, export_onnx, in_export_form
from converters.kinds import kind_for_config
from converters.loading import resolve_model_dir
from converters.quantization.correction import check_correction_share
from converters.quantization.int4 import check_int4_options
from converters.quantization.quantize import PLANNED, check_table_head, quantize_onnx, weight_width
from converters.quantization.training import trainer
from files.model_folder import check_model_folder, graph_file, lacks_tokenizer, load_lines, model_folder, own_ops
from texts.prior import check_prior, token_prior
from texts.tokens import load_tokenizer

HELP = "export a model or compressed checkpoint to ONNX, parity-checked"


def add_arguments(p) -> None:
    p.add_argument("model", nargs="?", default=None, help="model or checkpoint directory (default: the default model)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="model folder to write: the graph under onnx/ beside the source's config, tokenizer and "
        "sentence-transformers files, as those tools load it (default: MODEL_DIR-onnx beside the directory; "
        "original-onnx for the default model; -FORM, -SCHEME added for an export form other than the default and "
        "a quantization scheme); a path ending in .onnx writes the graph alone",
    )
    p.add_argument("--opset", type=int, default=17, help="ONNX opset, ≥ 17 (default: 17)")
    quantize_option(
        p,
        "write the graph quantized with this scheme, checked against its fp32 graph; -SCHEME is added to the "
        "default name",
    )
    calibration_options(p)
    data_option(p)
    export_form_options(p, many=False)
    prior_options(p)


def token_frequencies(args, source: Path, vocab: int) -> Calibration:
    """The token counts of every passage of the calibration text (--calib, else the default), blended
    with the prior as the data-aware methods blend them: what ranks tokens for an export form that
    caches the most frequent ones."""
    tokenizer = load_tokenizer(source)
    texts, where = kind_for_config(source).graph.passages(args.calib, "calib")
    calib = Calibration({}, token_counts(tokenizer, texts, vocab), tuple(tokenizer.all_special_ids))
    say(f"token counts: every passage of {where}, {calib.tokens:,} tokens")
    if args.freq_prior == "none" or args.prior_weight == 0:
        return calib
    say(f"token frequencies: blended with {args.freq_prior}'s English word frequencies at weight {args.prior_weight:g}")
    return calib.with_prior(token_prior(tokenizer, vocab), args.prior_weight)


def run(args) -> None:
    source = resolve_model_dir(args.model).absolute()
    stem = (source.parent / source.name) if args.model else Path("original")
    suffix = f"-{args.quantize}" if args.quantize else ""
    values = export_form_values(args)
    (form, _), *_ = export_form_rows(values)
    out = args.out or stem.with_name(f"{stem.name}{form}{suffix}-onnx")
    folder = out.suffix != ".onnx"
    check_int4_options(args.block_size, args.accuracy_level)
    check_correction_share(args.correction_share)
    check_table_head(args.table_head, [args.quantize])
    if args.quantize in PLANNED:
        raise CompressorError(
            f"--quantize {args.quantize} takes each layer's width from a byte budget: use compressor run --budget SIZE "
            f"--quantize {args.quantize}"
        )
    if folder:
        check_model_folder(out)
        check_outputs(args, model_folder=out)
    else:
        check_outputs(args, ONNX_file=out)
    check_prior(args.freq_prior, args.prior_weight)
    kind = kind_for_config(source)
    if folder and lacks_tokenizer(source):
        say(
            f"warning: {str(source)!r} has no tokenizer file; the folder will hold none, and tools cannot tokenize text"
        )
    schemes = [args.quantize] if args.quantize else []
    batches = quantize_calibration(args, schemes, kind.graph, source)
    fit_for = correction_fit(args, schemes, kind, source)
    model, _ = load_model(source)
    vocab = model.get_input_embeddings().num_embeddings
    model = in_export_form(model, values, lambda: token_frequencies(args, source, vocab))
    width = weight_width(args.quantize)
    with model_folder(out, source, width) if folder else contextlib.nullcontext(out) as path:
        checked = _export(args, model, vocab, path, fit_for, batches)
    if not folder:
        say(f"wrote {out} ({checked})")
        return
    graph = graph_file(width)
    say(f"wrote the model folder {out}, its graph {graph} ({checked}); it loads with:")
    for line in load_lines(out, graph, kind.graph.name):
        print(f"  {line}")
    needs = own_ops(out / graph)
    if needs:
        say(f"its graph uses ONNX Runtime's own operators ({', '.join(needs)}): only ONNX Runtime runs it")


def _export(args, model, vocab: int, path: Path, fit_for, batches) -> str:
    """The model's graph at `path`, quantized with args.quantize if asked; what its checks measured."""
    if not args.quantize:
        result = export_onnx(model, path, opset=args.opset)
        return f"parity max |ONNX − PyTorch| = {result.parity_max_abs:.2e}"
    with tempfile.TemporaryDirectory() as work:
        fp32 = export_onnx(model, Path(work) / "fp32.onnx", opset=args.opset)
        result = quantize_onnx(
            fp32.path,
            path,
            vocab,
            args.quantize,
            batches,
            args.block_size,
            args.accuracy_level,
            correction=args.correction_share,
            train=None if fit_for is None else trainer(model, fit_for(model)),
            table_head=args.table_head,
        )
    return (
        f"{args.quantize}; against its fp32 graph, whose parity with PyTorch is {fp32.parity_max_abs:.2e}: relative "
        f"error {result.parity_rel:.3f}, max |Δ| {result.parity_max_abs:.2e}, on {result.parity_input}"
    )
