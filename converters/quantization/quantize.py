"""Quantization stacked on any exported graph (docs/schemes/) with ONNX Runtime's own tools, by a scheme's config
(converters/quantization/registry.py; the built-in schemes in converters/quantization/schemes/): the graph's
products made MatMuls the quantizers take, the scheme's writer, then the gate. A quantized graph is checked
against its own fp32 graph: the relative error ‖y_q − y‖ / ‖y‖ of the output on inputs the exporter never saw must
stay under the scheme's gate (SchemeConfig.gate), or the graph kind's (an LM's is of its next-token
probabilities, below 1.0 at any width: eval.kinds.CAUSAL_LM.gated)."""

import tempfile
from pathlib import Path

import numpy as np

from compressor.errors import CompressorError, ExportParityError
from converters.quantization.registry import QuantizeResult, SchemeConfig, Source, schemes
from converters.quantization.rounding.three_bit_table import three_bit_outputs
from converters.quantization.storage.codebook_table import codebook_bits
from eval.benchmark import PARITY_KEY, WIDTH_KEY
from eval.graph import file_bytes, numbers_session
from eval.kinds import graph_kind
from eval.probe import PARITY_SHAPES, full_feed, row_blocks, row_chunks, sample_ids
from files.atomic import atomic_file
from files.model_folder import TARGET_KEY, graph_file
from files.onnx_files import add_props, load_onnx

__all__ = ["TARGET_KEY", "quantize_onnx", "quantize_for_targets", "is_quantized"]

QUANTIZED_OPS = {
    "DynamicQuantizeLinear",
    "DynamicQuantizeMatMul",
    "MatMulInteger",
    "QuantizeLinear",
    "DequantizeLinear",
    "MatMulNBits",
    "GatherBlockQuantized",
}


def is_quantized(path: Path) -> bool:
    """Whether the graph already holds quantized operators."""
    graph = load_onnx(path, weights=False).graph
    return any(node.op_type in QUANTIZED_OPS for node in graph.node)


def _parity(fp32: Path, quantized: Path, vocab: int, text: list[dict] | None, held: Path) -> tuple[float, float, str]:
    """(max |y_q − y|, ‖y_q − y‖ / ‖y‖, what it was fed) of the first output as its graph kind gates it
    (GraphKind.gated: an LM's log-probabilities): on the first batches of `text` (its kind's gate_batches; real
    tokens, padding left out), else on the export parity check's random ids. One session at a time (the fp32 one
    without packed copies of its weights: numbers_session), the fp32 graph's outputs kept in files under `held`
    while the quantized graph runs, compared a block of rows at a time (SmolLM2's gate held 1.3 GiB over its
    libraries with both sessions and the whole outputs in float64)."""
    kind = graph_kind(fp32)
    reference = numbers_session(fp32)
    names = [i.name for i in reference.get_inputs()]
    if text:
        feeds = text[: kind.gate_batches]
        fed = f"{sum(len(f[names[0]]) for f in feeds)} passages of text"
    else:
        shapes = PARITY_SHAPES
        feeds = [dict(zip(names, sample_ids(vocab, b, t, seed))) for b, t, seed in shapes]
        fed = "random ids"
    chunks = [part for whole in feeds for part in row_chunks(reference, whole)]
    output = reference.get_outputs()[0].name
    for i, feed in enumerate(chunks):
        np.save(held / f"gate-{i}.npy", _real(reference.run([output], full_feed(reference, feed))[0], feed))
    del reference
    other = numbers_session(quantized)
    worst, diff2, ref2 = 0.0, 0.0, 0.0
    for i, feed in enumerate(chunks):
        (y_q,) = other.run([output], full_feed(other, feed))
        y, y_q = np.load(held / f"gate-{i}.npy"), _real(y_q, feed)
        for part, part_q in row_blocks(y.reshape(-1, y.shape[-1]), y_q.reshape(-1, y_q.shape[-1])):
            part, part_q = kind.gated(part), kind.gated(part_q)
            worst = max(worst, float(np.abs(part_q - part).max()))
            diff2 += float(((part_q - part) ** 2).sum())
            ref2 += float((part**2).sum())
    return worst, (diff2 / max(ref2, 1e-30)) ** 0.5, fed


def _real(y: np.ndarray, feed: dict) -> np.ndarray:
    """The output at real tokens only (padding left out) where the feed's mask covers its first two axes."""
    mask = feed.get("attention_mask")
    return y[mask.astype(bool)] if mask is not None and mask.shape == y.shape[:2] else y


def quantize_onnx(
    src: Path,
    dst: Path,
    config: SchemeConfig,
    calibration: list[dict] | None = None,
    *,
    vocab: int,
    widths: dict[str, str] | None = None,
    train=None,
    frequencies: np.ndarray | None = None,
    keep_failed: bool = False,
) -> QuantizeResult:
    """Quantize the fp32 graph `src` of a model of `vocab` tokens into `dst` by the scheme `config` (parity-checked
    against `src`, then renamed); the caller has checked `config` against the graph's kind (`config.check`, which
    the pipeline runs once for every row before any work); `calibration`: the graph's input batches, for the
    calibrated schemes (and the gate's text); `widths`: module → width, for a planned scheme (mixed); `train`: for
    a trained scheme, (exported fp32 graph, its smoothed graph, the corrected graph with fp32 factors) → that graph
    with trained factors (corrections/training.py: `trainer`); `frequencies` (V,): what ranks the word table's
    head rows (None: the batches' counts); `keep_failed`: a graph off its gate is kept, its error in the result and
    the metadata, not refused."""
    name = config.scheme
    if config.calibrated and not calibration:
        raise CompressorError(f"{name} needs calibration batches")
    if config.planned and not widths:
        raise CompressorError(f"{name} quantizes each module at the width a byte budget chose; this model has none")
    if config.trains != (train is not None):
        trained = " or ".join(n for n, scheme in schemes().items() if scheme.trains)
        raise CompressorError(f"a trainer of the corrections goes with {trained}, not with {name}")
    src, dst = Path(src), Path(dst)
    if is_quantized(src):
        raise CompressorError(f"{str(src)!r} is already quantized; quantize its fp32 graph instead")
    kind = graph_kind(src)
    with atomic_file(dst, needed=file_bytes(src) // 3) as tmp, tempfile.TemporaryDirectory() as work:
        written = config.write(Source(src, kind, vocab, calibration, Path(work), widths, train, frequencies), tmp)
        worst, rel, fed = _parity(src, tmp, vocab, calibration, Path(work))
        tolerance = kind.gate_tol or config.gate
        failed = None
        if not rel <= tolerance:
            failed = f"the {name} graph of {str(src)!r} is off its fp32 graph by {rel:.3g} (relative, on {fed}), "
            failed += f"above {tolerance}"
            if not keep_failed:
                raise ExportParityError(failed)
        props = {PARITY_KEY: repr(worst), "compressor.parity_rel": repr(rel), "compressor.parity_input": fed}
        props[WIDTH_KEY] = str(config.width)
        props.update({"compressor.gate_failed": failed} if failed else {})
        target = config.target()
        props.update({TARGET_KEY: target} if target is not None else {})
        add_props(tmp, props)
        graph = load_onnx(tmp, weights=False).graph
    bits = 3 if three_bit_outputs(graph) else codebook_bits(graph) or 4
    measured = {"path": dst, "parity_max_abs": worst, "parity_rel": rel, "parity_input": fed}
    return QuantizeResult(**vars(written), **measured, table_bits=bits, gate_failed=failed)


def quantize_for_targets(src: Path, dst: Path, config: SchemeConfig, calibration=None, **given) -> QuantizeResult:
    """quantize_onnx into `dst` for the target measured here (config.target()), then, when `config` asks several
    CPUs (--target-cpu avx2,avx512_vnni), beside it for each other one under its name in a model folder
    (graph_file: model_qint8_TARGET.onnx …); the measured graph's result."""
    result = quantize_onnx(src, dst, config, calibration, **given)
    for target in config.targets():
        if target != config.target():
            other = Path(dst).with_name(Path(graph_file(config.width, target)).name)
            quantize_onnx(src, other, config.for_target(target), calibration, **given)
    return result
