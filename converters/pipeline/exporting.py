"""What `export` does, once its spec is checked (checks.check_export): the quantization's calibration read, the
model loaded and checked against what the graph takes (checks.check_fused), put in its export form, exported and
parity-checked, quantized in the spec's scheme against its fp32 graph, its key-value cache turned to int8 and its
head given a shortlist where asked, into a model folder (files.model_folder) or a graph file alone; then how to
load it, said."""

import contextlib
import functools
import tempfile
from pathlib import Path

from converters.checkpoint import load_model
from converters.export import export_onnx, in_export_form
from converters.kinds import ModelKind
from converters.pipeline.calibrating import head_frequencies, quantize_calibration, token_frequencies
from converters.pipeline.checks import check_fused
from converters.pipeline.say import say, say_traced
from converters.pipeline.steps import correction_fit
from converters.quantization.corrections.training import trainer
from converters.quantization.kv_cache import CACHE_PASSAGES, cache_scales, int8_cache
from converters.quantization.quantize import quantize_for_targets
from converters.quantization.registry import SchemeConfig
from converters.quantization.shortlist_head import SHORTLIST_PASSAGES, hidden_gram, shortlist_head
from converters.spec import ExportSpec
from eval.graph import load_graph
from eval.memory import trim_heap
from files.model_folder import graph_file, lacks_tokenizer, load_lines, model_folder, own_ops
from files.onnx_files import save_onnx
from texts.tokens import encode_passages, load_tokenizer

__all__ = ["export"]


def export(spec: ExportSpec, kind: ModelKind) -> Path:
    """The model of `spec.source`, of the kind `kind`, exported as `spec` asks, checked first by
    checks.check_export (whose spec this is: the shortlist's rank resolved); the path written."""
    source, out, texts, config = spec.source, spec.out, spec.texts, spec.config
    if spec.folder and lacks_tokenizer(source):
        say(
            f"warning: {str(source)!r} has no tokenizer file; the folder will hold none, and tools cannot tokenize text"
        )
    batches = quantize_calibration(texts, spec.quantize.schemes, kind.graph, source)
    fit_for = correction_fit(spec.quantize.schemes, texts.data, kind, source)
    model, _ = load_model(source)
    say_traced(model)
    check_fused(spec, model)
    vocab = model.get_input_embeddings().num_embeddings
    frequencies = functools.cache(
        lambda: token_frequencies(texts.calib, spec.freq_prior, spec.prior_weight, source, vocab)
    )
    model = in_export_form(model, spec.export_forms, frequencies)
    width = None if config is None else config.width
    several = config is not None and len(config.targets()) > 1
    target = config.target() if several else None  # one graph a target, under sentence-transformers' names
    with model_folder(out, source, width, target) if spec.folder else contextlib.nullcontext(out) as path:
        held, model = [model], None  # _export's alone, to let go once its graph is written
        checked = _export(held, path, config, spec.opset, vocab, fit_for, batches, frequencies)
        if spec.kv_cache == "int8":
            checked += _with_int8_cache(path, texts.calib, kind.graph, source)
        if spec.shortlist is not None:
            checked += _with_shortlist(path, texts.calib, kind.graph, source, spec.shortlist, spec.shortlist_rank)
    if not spec.folder:
        say(f"wrote {out} ({checked})")
        return out
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
    return out


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
