"""Quantization stacked on any exported graph (DESIGN §2.6) with ONNX Runtime's own tools: int8 is
`quantize_dynamic` with per-channel int8 weights (MatMul weights, factor matrices, TT cores and
tables behind a Gather alike), the one line every user knows; int8-aware first smooths the graph's
activation outliers into its weights from calibration batches (converters.smoothing, exact in
fp32), then quantizes the same way. A quantized graph is checked against
its own fp32 graph: the relative error ‖y_q − y‖ / ‖y‖ of the output on inputs the exporter never
saw must stay under INT8_REL_TOL."""

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from compressor.errors import CompressorError, ExportParityError
from converters.export import PARITY_SHAPES, sample_inputs
from converters.smoothing import activation_absmax, smooth
from eval.atomic import atomic_file
from eval.benchmark import PARITY_KEY
from eval.graph import file_bytes, make_session

__all__ = [
    "SCHEMES",
    "CALIBRATED",
    "INT8_AWARE_PASSAGES",
    "INT8_REL_TOL",
    "QuantizeResult",
    "quantize_onnx",
    "is_quantized",
]

SCHEMES = ("int8", "int8-aware")
CALIBRATED = ("int8-aware",)  # the schemes that need calibration batches
# Passages of the calibration text int8-aware reads: the maxima it takes grow with the text (on
# all-MiniLM-L6-v2, 256 pydoc passages: recall@10 0.936; all 292: 0.943).
INT8_AWARE_PASSAGES = 1024
# Relative output error an int8 graph may have against its fp32 graph on random ids: measured 0.15
# for all-MiniLM-L6-v2 and 0.20 for its fine-tuned TT rank-64 variant; a graph quantized wrongly is near 1.
INT8_REL_TOL = 0.35
QUANTIZED_OPS = {"DynamicQuantizeLinear", "MatMulInteger", "QuantizeLinear", "DequantizeLinear", "MatMulNBits"}


@dataclass(frozen=True)
class QuantizeResult:
    path: Path
    parity_max_abs: float  # against the fp32 graph
    parity_rel: float  # ‖y_q − y‖ / ‖y‖ against the fp32 graph


def is_quantized(path: Path) -> bool:
    """Whether the graph already holds quantized operators."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return any(node.op_type in QUANTIZED_OPS for node in graph.node)


def _parity(fp32: Path, quantized: Path, vocab: int) -> tuple[float, float]:
    """(max |y_q − y|, ‖y_q − y‖ / ‖y‖) of the first output over the sample inputs."""
    reference, other = make_session(fp32), make_session(quantized)
    worst, diff2, ref2 = 0.0, 0.0, 0.0
    names = [i.name for i in reference.get_inputs()]
    for batch, seq, seed in PARITY_SHAPES:  # the export parity check's inputs
        feed = {n: x.numpy() for n, x in zip(names, sample_inputs(vocab, batch, seq, seed))}
        (y,) = reference.run([reference.get_outputs()[0].name], feed)
        (y_q,) = other.run([reference.get_outputs()[0].name], feed)
        worst = max(worst, float(np.abs(y_q - y).max()))
        diff2 += float(((y_q - y) ** 2).sum())
        ref2 += float((y**2).sum())
    return worst, (diff2 / max(ref2, 1e-30)) ** 0.5


def quantize_onnx(
    src: Path, dst: Path, vocab: int, scheme: str = "int8", calibration: list[dict] | None = None
) -> QuantizeResult:
    """Quantize the fp32 graph `src` into `dst` (parity-checked against `src`, then renamed);
    `calibration`: the graph's input batches, for the schemes in CALIBRATED."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if scheme not in SCHEMES:
        raise CompressorError(f"a quantization scheme is one of {', '.join(SCHEMES)}, got {scheme!r}")
    if scheme in CALIBRATED and not calibration:
        raise CompressorError(f"{scheme} needs calibration batches")
    src, dst = Path(src), Path(dst)
    if is_quantized(src):
        raise CompressorError(f"{str(src)!r} is already quantized; quantize its fp32 graph instead")
    with atomic_file(dst, needed=file_bytes(src) // 3) as tmp, tempfile.TemporaryDirectory() as work:
        plain = Path(work) / "plain.onnx"  # without the fp32 parity of the metadata
        proto = onnx.load(str(src))
        del proto.metadata_props[:]
        if scheme in CALIBRATED:
            proto = smooth(proto, activation_absmax(proto, calibration))
        onnx.save_model(proto, str(plain))
        root, level = logging.getLogger(), logging.getLogger().level
        root.setLevel(max(level, logging.ERROR))  # not its advice to pre-process
        try:
            quantize_dynamic(plain, tmp, per_channel=True, weight_type=QuantType.QInt8)
        finally:
            root.setLevel(level)
        worst, rel = _parity(src, tmp, vocab)
        if not rel <= INT8_REL_TOL:
            raise ExportParityError(
                f"the int8 graph of {str(src)!r} is off its fp32 graph by {rel:.3g} (relative), above {INT8_REL_TOL}"
            )
        proto = onnx.load(str(tmp))
        onnx.helper.set_model_props(proto, {PARITY_KEY: repr(worst), "compressor.parity_rel": repr(rel)})
        onnx.save_model(proto, str(tmp))
    return QuantizeResult(dst, worst, rel)
