"""The pipeline the commands run, read from a typed spec (converters.spec): prepare (options checked,
texts, calibration) → make a variant (compress, fine-tune) → export and quantize → bench. `measure`
is a run or a sweep; `compress_checkpoint` one compressed checkpoint.

The names below load on first use (PEP 562): the rows and the bench (rows.py) run without PyTorch when a run hands
them to a process of its own (apart.py)."""

import importlib

_EXPORTS = {
    "check_run": "converters.pipeline.measuring",
    "measure": "converters.pipeline.measuring",
    "compress_checkpoint": "converters.pipeline.steps",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'converters.pipeline' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
