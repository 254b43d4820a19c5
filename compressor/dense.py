"""The dense weight of a trained linear layer, whichever way its class stores it."""

from torch import Tensor, nn
from transformers.pytorch_utils import Conv1D

from compressor.errors import PlanError

__all__ = ["dense_weight", "LINEAR_TYPES"]

LINEAR_TYPES = (nn.Linear, Conv1D)  # the linear layers the methods take


def dense_weight(layer: nn.Module) -> Tensor:
    """W (out × in) of an nn.Linear, or of a Hugging Face Conv1D, which stores it transposed (in × out)."""
    if isinstance(layer, nn.Linear):
        return layer.weight
    if isinstance(layer, Conv1D):
        return layer.weight.T
    raise PlanError(f"a linear layer is an nn.Linear or a Hugging Face Conv1D, not a {type(layer).__name__}")
