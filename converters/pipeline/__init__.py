"""The pipeline the commands run, read from a typed spec (converters.spec): prepare (options checked,
texts, calibration) → make a variant (compress, fine-tune) → export and quantize → bench. `measure`
is a run or a sweep; `export` one model's graph or model folder; `compress_checkpoint` one compressed
checkpoint. Their refusals before any work are checks.py's.

The names below load on first use (PEP 562): the rows and the bench (rows.py) run without PyTorch when a run hands
them over to its torch-free stage (torch_free.py, through a rows manifest: rows_manifest.py)."""

from compressor.lazy_names import lazy_names

__getattr__, __all__ = lazy_names(
    __name__,
    {
        "check_run": "converters.pipeline.checks",
        "measure": "converters.pipeline.measuring",
        "export": "converters.pipeline.exporting",
        "compress_checkpoint": "converters.pipeline.steps",
    },
)
