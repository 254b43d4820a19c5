"""The fine-tune: distilling the original into its compressed copy (`finetune_`, distil.py), its settings and
report (config.py), loss (loss.py), state on disk (state.py) and data (data.py)."""

from converters.finetune.config import FinetuneConfig, FinetuneReport
from converters.finetune.distil import Distillation, FinetuneRun, finetune_, pick_device, trainable_parameters

__all__ = [
    "Distillation",
    "FinetuneConfig",
    "FinetuneReport",
    "FinetuneRun",
    "finetune_",
    "pick_device",
    "trainable_parameters",
]
