"""Applying compression to a trained model: load, plan, compress_, save, export to ONNX.

The names below load on first use (PEP 562), so that the modules that round and bench ONNX graphs import without
PyTorch (converters/pipeline/continued.py)."""

import importlib

_EXPORTS = {
    "load_model": "converters.checkpoint",
    "save_compressed": "converters.checkpoint",
    "CompressionReport": "converters.compress",
    "compress_": "converters.compress",
    "export_embedding_onnx": "converters.export",
    "export_onnx": "converters.export",
    "LowRankConfig": "converters.methods.lowrank",
    "PHMConfig": "converters.methods.phm",
    "TTConfig": "converters.methods.tt",
    "Plan": "converters.plan",
    "Method": "converters.registry",
    "Option": "converters.registry",
    "register": "converters.registry",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'converters' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
