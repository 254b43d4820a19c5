"""Quantization of exported graphs with ONNX Runtime's own tools (docs/schemes/): `quantize_onnx` by a scheme's
config (the registry; the schemes, one module each, in schemes/), over rounding/, storage/ and corrections/."""

from converters.quantization.quantize import is_quantized, quantize_onnx
from converters.quantization.registry import QuantizeResult, SchemeConfig, register, scheme_named, schemes

__all__ = ["QuantizeResult", "SchemeConfig", "is_quantized", "quantize_onnx", "register", "scheme_named", "schemes"]
