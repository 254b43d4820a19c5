"""The fine-tune: distilling the original into its compressed copy (`finetune_`, distil.py), its settings and
report (config.py), loss (loss.py), state on disk (state.py) and data (data.py)."""

from converters.finetune.config import FinetuneConfig, FinetuneReport
from converters.finetune.distil import finetune_, pick_device, trainable_parameters

__all__ = ["FinetuneConfig", "FinetuneReport", "finetune_", "pick_device", "trainable_parameters"]
