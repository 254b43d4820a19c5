"""Applying compression to a trained model: load, plan, compress_, save, export to ONNX.

The names below load on first use (PEP 562), so that the modules that round and bench ONNX graphs import without
PyTorch (a run's torch-free stage: converters/pipeline/torch_free.py)."""

from compressor.lazy_names import lazy_names

__getattr__, __all__ = lazy_names(
    __name__,
    {
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
    },
)
