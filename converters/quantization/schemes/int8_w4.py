"""int8-w4 (encoders): the linear layers stored in 4 bits and multiplied in int8. int8-aware-table's graph (dynamic
int8 products, the word table in 3 bits) with each layer's int8 weight replaced by 4-bit codes with one scale a
column (rounding/column_int4.py: clip search, GPTQ in act-order, scales refitted, on the layer's input Gram), stored
as ONNX INT4 behind one Cast to int8 (storage/int4_cast.py), which ONNX Runtime folds when the session starts: the
file about half of int8's, the process and the products int8's. The layers whose 4 bits cost the most output
error a byte (relative, on calibration batches) may stay in int8, adding up to `int8_share` of the 4-bit codes' bytes
(int4.eight_bit_layers, int4-aware's rule).

Smoothed only where an activation holds outliers (its largest channel OUTLIER_RATIO times its median: a 110M MPNet's
FFN down-projections, none of MiniLM's), at int8-aware's α: smoothing moves an activation's range into the weights,
which 4 bits then round worse (MiniLM recall@10 0.809 / 0.795 with every activation smoothed at α 0.5, 0.839 / 0.829
with none, docs/schemes/int8-w4.md), and its Mul costs 4 µs a call at (1,16).
4-bit codes never leave int16 in AVX2's pair sums (2 · 255 · 8 = 4,080), so only the layers kept in int8 are
bounded for a CPU (`target_cpu`)."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from compressor.errors import CompressorError
from converters.options import Option, option_field
from converters.quantization.corrections.correction import input_grams, relative_error
from converters.quantization.registry import QuantizeResult, Source, Written, register
from converters.quantization.rounding.column_int4 import column_codes
from converters.quantization.rounding.int4 import eight_bit_layers, weight_names
from converters.quantization.rounding.smoothing import OUTLIER_RATIO
from converters.quantization.schemes.int8_aware_table import Int8AwareTableConfig
from converters.quantization.storage.int4_cast import store_int4
from files.onnx_files import save_onnx

__all__ = ["Int8W4Config"]

INT8_SHARE = Option(
    "--int8-share",
    "int8-w4: the bytes the linear layers kept in int8 may add, as a share of the 4-bit codes' (weights and "
    "tables), those whose 4 bits cost the most output error a byte first (0: every layer in 4 bits)",
    type=float,
    metavar="SHARE",
    neutral=0.0,
)


@register
@dataclass(frozen=True)
class Int8W4Config(Int8AwareTableConfig):
    """int8-aware-table, its outlying activations alone smoothed, with its linear layers' codes in 4 bits (one scale a
    column), those kept in int8 adding up to `int8_share` of the 4-bit codes' bytes."""

    scheme = "int8-w4"
    summary = "(encoders) 4-bit weights multiplied in int8, the word table in 3 bits"
    width = 4
    gate = 0.5  # int4's: 4-bit weights leave more output error than int8's 0.35
    int8_share: float = option_field(0.0, INT8_SHARE)

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.int8_share <= 1:
            raise CompressorError(
                f"--int8-share is a share of the 4-bit codes' bytes, from 0 to 1, got {self.int8_share:g}"
            )

    def channels(self, model: onnx.ModelProto, absmax: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The activations whose largest channel is OUTLIER_RATIO times their median or more: those one int8 scale
        does not hold unsmoothed (a 110M MPNet's FFN down-projections). The rest are not smoothed: smoothing moves
        their range into the weights, which 4 bits round worse, and each costs a Mul a call."""
        return {
            name: peak for name, peak in absmax.items() if peak.max() >= OUTLIER_RATIO * max(np.median(peak), 1e-30)
        }

    def write(self, source: Source, out: Path) -> Written:
        """int8-aware-table's graph (its outliers smoothed), then each layer's int8 weight in 4-bit columns but those
        kept."""
        model, outlying = self.smoothed(source)
        self.write_int8(model, source, out)
        grams = input_grams(model, source.calibration)
        held = {i.name: i for i in model.graph.initializer}
        quantized = onnx.load(str(out))
        int8 = {i.name for i in quantized.graph.initializer}
        nodes = {n.output[0]: n.name for n in model.graph.node}
        layers = {}  # MatMul node → (weight name, codes, scales, relative output error)
        for output, name in weight_names(model.graph).items():
            if f"{name}_quantized" not in int8 or output not in grams:
                continue
            weight = numpy_helper.to_array(held[name])
            gram = grams[output].numpy()
            codes, scales = column_codes(weight, gram)
            layers[nodes[output]] = (name, codes, scales, relative_error(weight - codes * scales, weight, gram))
        losses = {node: error**2 for node, (_, _, _, error) in layers.items()}
        kept = eight_bit_layers(model, losses, self.int8_share) if self.int8_share else []
        scales_of = {i.name: i for i in quantized.graph.initializer}
        for node, (name, codes, scales, _) in layers.items():
            if node not in kept:
                store_int4(quantized, f"{name}_quantized", codes)
                scales_of[f"{name}_scale"].CopyFrom(numpy_helper.from_array(scales, f"{name}_scale"))
        save_onnx(quantized, out)
        return Written(eight_bit=tuple(kept), outliers=outlying)

    def report(self, result: QuantizeResult) -> dict:
        return {**super().report(result), "int8_share": self.int8_share, "eight_bit_layers": list(result.eight_bit)}
