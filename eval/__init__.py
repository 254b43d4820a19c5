"""Measuring ONNX models on the CPU: size, memory, latency, quality; the report."""

from eval.benchmark import bench
from eval.corpus import default_passages, read_passages
from eval.report import markdown_table, write_report

__all__ = ["bench", "default_passages", "markdown_table", "read_passages", "write_report"]
