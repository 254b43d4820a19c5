"""Applying compression to a trained model: load, plan, compress_, save, export to ONNX."""

from converters.checkpoint import load_model, save_compressed
from converters.compress import CompressionReport, compress_
from converters.export import export_embedding_onnx, export_onnx
from converters.methods.lowrank import LowRankConfig
from converters.methods.phm import PHMConfig
from converters.methods.tt import TTConfig
from converters.plan import Plan
from converters.registry import Method, Option, register

__all__ = [
    "CompressionReport",
    "LowRankConfig",
    "Method",
    "Option",
    "PHMConfig",
    "Plan",
    "TTConfig",
    "register",
    "compress_",
    "export_embedding_onnx",
    "export_onnx",
    "load_model",
    "save_compressed",
]
