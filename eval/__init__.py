"""Measuring ONNX models on the CPU: size, memory, latency, quality; the report."""

from eval.benchmark import bench
from eval.report import markdown_table, write_report

__all__ = ["bench", "markdown_table", "write_report"]
