"""int4-trained: int4-corrected's graph, its corrections then learnt by distillation against the fp32 model
with every weight held as the graph rounds it (corrections/training.py): the fine-tune minimises the distance of the
student's output to the original's for `correction_time` seconds at `correction_lr`, then the factors go back
into the graph and are rounded to 8 bits."""

from dataclasses import dataclass

from compressor.errors import CompressorError
from converters.options import Option, option_field
from converters.quantization.corrections.training import CORRECTION_SECONDS
from converters.quantization.registry import register
from converters.quantization.schemes.int4_corrected import Int4CorrectedConfig

__all__ = ["CORRECTION_LR_OPTION", "Int4TrainedConfig"]

CORRECTION_TIME = Option(
    "--correction-time",
    "seconds of the fine-tune that trains the corrections against the fp32 model, on the fine-tune text (--data)",
    float,
    metavar="SECONDS",
)
CORRECTION_LR_OPTION = Option(
    "--correction-lr",
    "the learning rate of the corrections, gains, biases and norms the fine-tune trains",
    float,
    flagged=False,
)


@register
@dataclass(frozen=True)
class Int4TrainedConfig(Int4CorrectedConfig):
    """int4-corrected with its corrections trained for `correction_time` seconds at `correction_lr`, the best
    measured in the budget (BENCHMARKS.md, "Train through the rounding" and "The trained schemes' learning
    rates")."""

    scheme = "int4-trained"
    summary = "int4-aware with low-rank corrections of the rounding error, trained"
    trains = True
    correction_time: float = option_field(CORRECTION_SECONDS, CORRECTION_TIME)
    correction_lr: float = option_field(2e-4, CORRECTION_LR_OPTION)

    def __post_init__(self):
        super().__post_init__()
        if self.correction_time <= 0:
            raise CompressorError(f"--correction-time is a time budget in seconds, > 0, got {self.correction_time:g}")
        if self.correction_lr <= 0:
            raise CompressorError(f"correction_lr is a learning rate, > 0, got {self.correction_lr:g}")
