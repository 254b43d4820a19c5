"""What the corrections are fitted to and the sensitivity weighs, in numpy alone (no PyTorch: the rows of a run's
stages after the export round in a process without it): a MatMul's rounding error E = W − Q, made a layer (or a
slice of its columns) at a read, and the real tokens x of a layer's input on the calibration batches."""

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from converters.nbits_storage import dequantize_grid, dequantize_nbits, nbits_grid
from converters.quantization.rounding.int4 import weight_names
from converters.quantization.rounding.smoothing import probe_activations

__all__ = ["GRAM_BATCHES", "input_rows", "RoundingErrors", "column_slices", "fp64_weight", "rounding_errors"]

GRAM_BATCHES = 8  # calibration batches the input Grams sum over (256 passages at the default batch)
ERROR_VALUES = 1 << 22  # weights of a layer's rounding error made at once by RoundingErrors.columns


def input_rows(model: onnx.ModelProto, names: list[str], feeds: list[dict]):
    """{name: its rows (tokens × K)} of the graph's tensors `names` for each batch (or a batch's chunk) of the first
    GRAM_BATCHES of `feeds`, the real tokens only (an attention mask, when the batch has one, drops the padding)."""
    for feed, values in probe_activations(model, names, feeds[:GRAM_BATCHES]):
        mask = feed.get("attention_mask")
        rows = {}
        for name, value in values.items():
            x = value.reshape(-1, value.shape[-1])
            rows[name] = x[mask.reshape(-1).astype(bool)] if mask is not None and mask.size == len(x) else x
        yield rows


class RoundingErrors(Mapping):
    """Output name → W − Q (float64) of each MatMul of `fp32` that `quantized` holds in MatMulNBits, made anew on each
    read, so that a caller holds a layer's at a time (an LM's at once in fp64 were twice its fp32 weights)."""

    def __init__(self, quantized: onnx.ModelProto, fp32: onnx.ModelProto):
        initializers = {i.name: i for i in fp32.graph.initializer}
        self._weights = {out: initializers[w] for out, w in weight_names(fp32.graph).items()}
        self._graph = quantized.graph
        self._nodes = {
            n.output[0]: n for n in self._graph.node if n.op_type == "MatMulNBits" and n.output[0] in self._weights
        }

    def __getitem__(self, out: str) -> np.ndarray:
        return fp64_weight(self._weights[out]) - dequantize_nbits(self._graph, self._nodes[out])

    def __iter__(self):
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def columns(self, out: str):
        """W − Q of `out` (float64), ERROR_VALUES weights' columns at a time, in order."""
        grid, weight = nbits_grid(self._graph, self._nodes[out]), numpy_helper.to_array(self._weights[out])
        for columns in column_slices(*weight.shape):
            yield weight[:, columns].astype(np.float64) - dequantize_grid(grid, columns)

    def shape(self, out: str) -> tuple[int, int]:
        """K × N, read from the weight's dims."""
        k, n = self._weights[out].dims
        return int(k), int(n)


def column_slices(k: int, n: int):
    """The slices of N columns of a K × N weight that hold about ERROR_VALUES of its weights each, in order."""
    step = max(1, ERROR_VALUES // k)
    return [slice(at, at + step) for at in range(0, n, step)]


def fp64_weight(initializer: onnx.TensorProto) -> np.ndarray:
    return numpy_helper.to_array(initializer).astype(np.float64)


def rounding_errors(quantized: onnx.ModelProto, fp32: onnx.ModelProto) -> RoundingErrors:
    """Output name → W − Q (float64) of each MatMul of `fp32` that `quantized` holds in MatMulNBits, a layer a read."""
    return RoundingErrors(quantized, fp32)
