"""Projections a graph multiplies side by side, in the student of a trained scheme (training.student_of). The fused
decoder (kinds.fused_decoder) multiplies x by [W_q | W_k | W_v] in one MatMul, so one rounding, one correction and
one set of block gains hold all three: the student holds them as one CorrectedLinear over the concatenated outputs,
which each projection reads its slice of, Slice(x) = fused(x)[…, a:b], the product made once for the three."""

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["SIDE_BY_SIDE", "side_by_side", "put_side_by_side", "fuse"]

SIDE_BY_SIDE = ("q_proj", "k_proj", "v_proj")  # the attention's projections the fused decoder multiplies at once


def side_by_side(model: nn.Module) -> dict[str, Tensor]:
    """Name of each module holding SIDE_BY_SIDE nn.Linear projections → their weights side by side (in, Σ out),
    as the graph holds them."""
    found = {}
    for name, module in model.named_modules():
        parts = [getattr(module, part, None) for part in SIDE_BY_SIDE]
        if all(type(p) is nn.Linear for p in parts):
            found[name] = torch.cat([p.weight for p in parts]).T
    return found


def put_side_by_side(model: nn.Module, name: str, value: np.ndarray) -> None:
    """Set the projections of module `name` to the columns of `value` (in, Σ out), in SIDE_BY_SIDE order."""
    module = model.get_submodule(name)
    start = 0
    for part in SIDE_BY_SIDE:
        linear = getattr(module, part)
        stop = start + linear.out_features
        linear.weight.data = torch.from_numpy(np.ascontiguousarray(value[:, start:stop].T, dtype=np.float32))
        start = stop


class _Fused(nn.Module):
    """`layer` (a CorrectedLinear over the concatenated outputs), its last product kept for the next slice of
    the same input."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer
        self._last: tuple[Tensor, Tensor] | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self._last is None or self._last[0] is not x:
            self._last = (x, self.layer(x))
        return self._last[1]


class Slice(nn.Module):
    """Outputs a:b of a fused product."""

    def __init__(self, fused: _Fused, start: int, stop: int):
        super().__init__()
        self.fused, self.start, self.stop = fused, start, stop

    def forward(self, x: Tensor) -> Tensor:
        return self.fused(x)[..., self.start : self.stop]


def fuse(model: nn.Module, name: str, layer: nn.Module) -> str:
    """Module `name`'s projections (in place) made slices of `layer`, which computes them side by side; the name
    under which `model` holds `layer`."""
    module = model.get_submodule(name)
    fused, start = _Fused(layer), 0
    for part in SIDE_BY_SIDE:
        stop = start + getattr(module, part).out_features
        setattr(module, part, Slice(fused, start, stop))
        start = stop
    return f"{name}.{SIDE_BY_SIDE[0]}.fused.layer" if name else f"{SIDE_BY_SIDE[0]}.fused.layer"
