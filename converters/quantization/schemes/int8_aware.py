"""int8-aware: int8 after SmoothQuant (rounding/smoothing.py): each activation's channel j divided by
s_j = max|x_j|^α / max|W_j·|^(1−α) on calibration batches and the weight rows multiplied by it (exact in
fp32), so that one int8 scale a tensor holds the activations; the layers whose inputs hold outliers named."""

from dataclasses import dataclass
from functools import partial

import numpy as np
import onnx

from converters.quantization.registry import Source, register
from converters.quantization.rounding.smoothing import SMOOTH_ALPHA, smoothed
from converters.quantization.schemes.int8 import Int8Config

__all__ = ["Int8AwareConfig"]


@register
@dataclass(frozen=True)
class Int8AwareConfig(Int8Config):
    """int8 of the graph smoothed at `alpha` (SMOOTH_ALPHA)."""

    scheme = "int8-aware"
    summary = "int8 after SmoothQuant"
    calibrated = True
    alpha = SMOOTH_ALPHA

    def channels(self, model: onnx.ModelProto, absmax: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The activations smoothed, of their maxima `absmax`: all of them."""
        return absmax

    def smoothed(self, source: Source) -> tuple[onnx.ModelProto, dict]:
        return smoothed(partial(source.fp32, lazy=True), source.calibration, self.alpha, self.channels, source.work)
