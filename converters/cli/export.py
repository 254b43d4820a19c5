"""compressor export MODEL [--out DIR]: a model or checkpoint to a ready model folder (files.model_folder)
whose ONNX graph is parity-checked; --out FILE.onnx writes the graph alone; --kv-cache int8: a causal LM's
fused decoder with its key-value cache in int8 (converters/quantization/kv_cache.py); --shortlist K: its decoding steps
scoring the K best of a low-rank fit of its head exactly (converters/quantization/shortlist_head.py)."""

import contextlib
import functools
import json
import tempfile
from pathlib import Path

from compressor.errors import CompressorError
from converters.checkpoint import load_model
from converters.cli.corrected_needs import corrected_said
from converters.cli.options import (
    calibration_options,
    data_option,
    export_form_options,
    export_form_values,
    prior_options,
    quantize_option,
)
from converters.cli.specs import quantize_spec, text_spec
from converters.export import export_form_rows, export_onnx, in_export_form
from converters.kinds import kind_for_config
from converters.kinds.fused_decoder import fits_fused
from converters.loading import resolve_model_dir
from converters.pipeline.calibrating import head_frequencies, quantize_calibration, token_frequencies
from converters.pipeline.say import say, say_traced
from converters.pipeline.steps import check_schemes, correction_fit
from converters.quantization.corrections.training import trainer
from converters.quantization.kv_cache import CACHE_PASSAGES, CACHE_TYPES, cache_scales, int8_cache
from converters.quantization.quantize import quantize_for_targets
from converters.quantization.registry import SchemeConfig
from converters.quantization.shortlist_head import (
    SHORTLIST_PASSAGES,
    SHORTLIST_RANK,
    check_shortlist,
    hidden_gram,
    shortlist_head,
)
from eval.graph import load_graph
from eval.kinds import CAUSAL_LM
from eval.memory import trim_heap
from files.atomic import check_writable
from files.model_folder import check_model_folder, graph_file, lacks_tokenizer, load_lines, model_folder, own_ops
from files.onnx_files import save_onnx
from texts.prior import check_prior
from texts.tokens import encode_passages, load_tokenizer

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
        "exactly, every other logit −∞ (a prompt's pass keeps the whole head); the fused decoder's graph, in fp32, "
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
    source = resolve_model_dir(args.model).absolute()
    stem = (source.parent / source.name) if args.model else Path("original")
    suffix = f"-{args.quantize}" if args.quantize else ""
    values = export_form_values(args)
    (form, _), *_ = export_form_rows(values)
    out = args.out or stem.with_name(f"{stem.name}{form}{suffix}-onnx")
    folder = out.suffix != ".onnx"
    quantize, texts = quantize_spec(vars(args)), text_spec(vars(args))
    config = quantize.schemes[0] if quantize.schemes else None
    if config is not None and config.planned:
        raise CompressorError(
            f"--quantize {config.scheme} takes each layer's width from a byte budget: use compressor run --budget SIZE "
            f"--quantize {config.scheme}"
        )
    if config is not None and len(config.targets()) > 1 and not folder:
        raise CompressorError(
            f"--target-cpu {config.target_cpu} writes one graph for each CPU into a model folder: give --out a folder"
        )
    if folder:
        check_model_folder(out)
        check_writable(out, "model folder")
    else:
        check_writable(out, "ONNX file")
    check_prior(args.freq_prior, args.prior_weight)
    kind = kind_for_config(source)
    if args.kv_cache != "fp32" and kind.graph is not CAUSAL_LM:
        raise CompressorError(
            f"--kv-cache {args.kv_cache} is a causal LM's cache; {str(source)!r} is a model of the {kind.name} kind"
        )
    if args.shortlist is None and args.shortlist_rank is not None:
        raise CompressorError("--shortlist-rank sets the rank of a shortlist head: give --shortlist K with it")
    rank = _check_shortlist(args, source, kind, config) if args.shortlist is not None else None
    check_schemes([quantize], kind.graph)
    if kind.graph is CAUSAL_LM:
        for needs in corrected_said(source, quantize.schemes):
            say(needs)
    if folder and lacks_tokenizer(source):
        say(
            f"warning: {str(source)!r} has no tokenizer file; the folder will hold none, and tools cannot tokenize text"
        )
    batches = quantize_calibration(texts, quantize.schemes, kind.graph, source)
    fit_for = correction_fit(quantize.schemes, texts.data, kind, source)
    model, _ = load_model(source)
    say_traced(model)
    if args.kv_cache != "fp32" and not fits_fused(model):
        raise CompressorError(
            f"--kv-cache {args.kv_cache} is written into the fused decoder's attention, and {str(source)!r} is not a "
            "Llama-style LM of plain layers that it takes (its graph is the PyTorch exporter's): keep --kv-cache fp32"
        )
    if args.shortlist is not None and not fits_fused(model):
        raise CompressorError(
            f"--shortlist is written into the fused decoder's head, and {str(source)!r} is not a Llama-style LM of "
            "plain layers that it takes (its graph is the PyTorch exporter's)"
        )
    vocab = model.get_input_embeddings().num_embeddings
    frequencies = functools.cache(
        lambda: token_frequencies(texts.calib, args.freq_prior, args.prior_weight, source, vocab)
    )
    model = in_export_form(model, values, frequencies)
    width = None if config is None else config.width
    several = config is not None and len(config.targets()) > 1
    target = config.target() if several else None  # one graph a target, under sentence-transformers' names
    with model_folder(out, source, width, target) if folder else contextlib.nullcontext(out) as path:
        held, model = [model], None  # _export's alone, to let go once its graph is written
        checked = _export(held, path, config, args.opset, vocab, fit_for, batches, frequencies)
        if args.kv_cache == "int8":
            checked += _with_int8_cache(path, texts.calib, kind.graph, source)
        if args.shortlist is not None:
            checked += _with_shortlist(path, texts.calib, kind.graph, source, args.shortlist, rank)
    if not folder:
        say(f"wrote {out} ({checked})")
        return
    graph = graph_file(width, target)
    if several:
        beside = ", ".join(graph_file(width, t) for t in config.targets() if t != target)
        say(f"beside {graph}, for the other CPUs asked: {beside}")
    say(f"wrote the model folder {out}, its graph {graph} ({checked}); it loads with:")
    for line in load_lines(out, graph, kind.graph.name):
        print(f"  {line}")
    needs = own_ops(out / graph)
    if needs:
        say(f"its graph uses ONNX Runtime's own operators ({', '.join(needs)}): only ONNX Runtime runs it")


def _check_shortlist(args, source: Path, kind, config: SchemeConfig | None) -> int:
    """The shortlist's rank (asked, or SHORTLIST_RANK and at most half the hidden width); one sentence before any work
    for a shortlist this model or scheme cannot take (shortlist_head.check_shortlist; the sizes from config.json)."""
    if kind.graph is not CAUSAL_LM:
        raise CompressorError(f"--shortlist is a causal LM's head; {str(source)!r} is a model of the {kind.name} kind")
    sizes = json.loads((source / "config.json").read_text())
    if not all(isinstance(sizes.get(key), int) for key in ("vocab_size", "hidden_size")):
        raise CompressorError(
            f"--shortlist reads the LM's vocab_size and hidden_size, which {str(source)!r}'s config.json lacks"
        )
    vocab, hidden = sizes["vocab_size"], sizes["hidden_size"]
    rank = min(SHORTLIST_RANK, hidden // 2) if args.shortlist_rank is None else args.shortlist_rank
    check_shortlist(args.shortlist, rank, vocab, hidden, config and config.scheme)
    return rank


def _calibration(calib: Path | None, kind_graph, source: Path, count: int) -> tuple[list[dict], str]:
    """The first `count` calibration passages as batches of ids, and what they are, said."""
    passages, where = kind_graph.passages(calib, "calib")
    return encode_passages(load_tokenizer(source), passages[:count]), f"{min(len(passages), count)} passages of {where}"


def _with_int8_cache(path: Path, calib: Path | None, kind_graph, source: Path) -> str:
    """The graph at `path` rewritten with an int8 key-value cache, its scales from the calibration text's
    keys and values as that graph computes them; what was done."""
    batches, said = _calibration(calib, kind_graph, source, CACHE_PASSAGES)
    save_onnx(int8_cache(load_graph(path), cache_scales(path, batches)), path)
    return f"; its key-value cache in int8, scales from {said}"


def _with_shortlist(path: Path, calib: Path | None, kind_graph, source: Path, shortlist: int, rank: int) -> str:
    """The graph at `path` rewritten with a shortlist head (shortlist_head), its fit in the Gram of the head's input
    as that graph computes it on the calibration text; what was done."""
    batches, said = _calibration(calib, kind_graph, source, SHORTLIST_PASSAGES)
    gram = hidden_gram(path, batches)
    save_onnx(shortlist_head(load_graph(path), gram, shortlist, rank), path)
    return (
        f"; its decoding steps score exactly the {shortlist} best of a rank-{rank} fit of its head (the fit on {said})"
    )


def _export(
    held: list, path: Path, config: SchemeConfig | None, opset: int, vocab: int, fit_for, batches, frequencies
) -> str:
    """The graph of the model `held` hands over (a list of it, emptied here) at `path`, quantized by the scheme
    `config` if any; what its checks measured; `frequencies`: the token frequencies (a Calibration) that rank the
    word table's head rows. The model goes once PyTorch's parity outputs are made (export_onnx), before ONNX
    Runtime reads its graph, unless a trained scheme's trainer holds it: an LM's weights in PyTorch are as large as
    the graph (2 GB at 0.5B)."""
    if config is None:
        result = export_onnx(held, path, opset=opset)
        return f"parity max |ONNX − PyTorch| = {result.parity_max_abs:.2e}"
    fit = None if fit_for is None else fit_for(held[0], config, config.scheme)
    train = None if fit is None else trainer(held[0], fit)  # it holds the model; else the export lets it go
    with tempfile.TemporaryDirectory() as work:
        fp32 = export_onnx(held, Path(work) / "fp32.onnx", opset=opset)
        trim_heap()
        result = quantize_for_targets(
            fp32.path,
            path,
            config,
            batches,
            vocab=vocab,
            train=train,
            frequencies=head_frequencies(config, frequencies),
        )
    for note in config.notes(result):
        say(f"warning: {note}")
    return (
        f"{config.scheme}; against its fp32 graph, whose parity with PyTorch is {fp32.parity_max_abs:.2e}: "
        f"relative error {result.parity_rel:.3f}, max |Δ| {result.parity_max_abs:.2e}, on {result.parity_input}"
    )
