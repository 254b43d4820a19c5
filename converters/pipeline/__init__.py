"""The pipeline the commands run, read from a typed spec (converters.spec): prepare (options checked,
texts, calibration) → make a variant (compress, fine-tune) → export and quantize → bench. `measure`
is a run or a sweep; `compress_checkpoint` one compressed checkpoint."""

from converters.pipeline.measuring import check_run, measure
from converters.pipeline.steps import compress_checkpoint

__all__ = ["check_run", "measure", "compress_checkpoint"]
