"""Measuring ONNX models on the CPU: size, memory, latency, decoding, quality; the report.

The names below load on first use (PEP 562), so that importing one light module of eval (its graph helpers, which
decoding stands on) runs none of the others."""

from compressor.lazy_names import lazy_names

__getattr__, __all__ = lazy_names(
    __name__,
    {"bench": "eval.benchmark", "markdown_table": "eval.report", "write_report": "eval.report"},
)
