"""Applying compression to a trained model: load, plan, compress_, save, export to ONNX."""

from converters.checkpoint import load_model, save_compressed
from converters.compress import CompressionReport, compress_
from converters.export import export_embedding_onnx, export_onnx
from converters.plan import Plan, TTConfig

__all__ = [
    "CompressionReport",
    "Plan",
    "TTConfig",
    "compress_",
    "export_embedding_onnx",
    "export_onnx",
    "load_model",
    "save_compressed",
]
