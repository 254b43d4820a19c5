"""compressor export MODEL [--out DIR]: a model or checkpoint to a ready model folder (files.model_folder)
whose ONNX graph is parity-checked; --out FILE.onnx writes the graph alone; --kv-cache int8: a causal LM's
fused decoder with its key-value cache in int8 (converters/quantization/kv_cache.py); --shortlist K: its decoding steps
scoring the K best of a low-rank fit of its head exactly (converters/quantization/shortlist_head.py). argv → one spec
(specs.export_spec) → its checks (pipeline/checks.py) → pipeline.export."""

from pathlib import Path

from converters.cli.corrected_needs import corrected_said
from converters.cli.options import (
    calibration_options,
    data_option,
    export_form_options,
    export_form_values,
    prior_options,
    quantize_option,
)
from converters.cli.specs import export_spec
from converters.kinds import kind_for_config
from converters.loading import resolve_model_dir
from converters.pipeline import export
from converters.pipeline.checks import check_export
from converters.pipeline.say import say
from converters.quantization.kv_cache import CACHE_TYPES
from converters.quantization.shortlist_head import SHORTLIST_RANK
from eval.kinds import CAUSAL_LM

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
    p.add_argument(
        "--kv-cache",
        choices=CACHE_TYPES,
        default="fp32",
        help="a causal LM's key-value cache: fp32, or int8 with a scale per head and channel from the calibration "
        "text (a quarter of the bytes each generated token reads again; the fused decoder's graph, Llama-style "
        "LMs; default: fp32)",
    )
    p.add_argument(
        "--shortlist",
        type=int,
        default=None,
        metavar="K",
        help="a causal LM's decoding steps score the vocabulary by a low-rank fit of the head and only its K best "
        "exactly, every other logit −∞ (a prompt's pass keeps the whole head); the fused decoder's graph, in fp32, w8, "
        "int4 or int4-aware (default: the whole head)",
    )
    p.add_argument(
        "--shortlist-rank",
        type=int,
        default=None,
        metavar="R",
        help=f"the rank of the shortlist's fit, below the hidden width (default: {SHORTLIST_RANK}, at most half of it)",
    )


def run(args) -> None:
    """argv → the export's spec → its checks, before any work → the export."""
    source = resolve_model_dir(args.model).absolute()
    spec = export_spec(vars(args), source, export_form_values(args))
    kind = kind_for_config(source)
    spec = check_export(spec, kind)
    if kind.graph is CAUSAL_LM:  # a corrected scheme's time and peak, refused before any work where it does not fit
        for needs in corrected_said(source, spec.quantize.schemes):
            say(needs)
    export(spec, kind)
