"""A linear layer as a block quantizer rounded it, with its scales and a low-rank correction of its
rounding error trainable: y = x Qᵀ + b + (x A) B, Q[n, k] = level[n, k] · scale[n, k // block] ·
gain[n, k // block] / s[k] — the levels (integers q − z) frozen, the scales trained through a gain that
starts at 1, s a per-input-channel divisor (SmoothQuant's, 1 where none), A (D × r) and B (r × K) the
correction (r may be 0). Training the gains, A, B (and b) against the unrounded model is training
through the rounding: the forward pass sees the weights the quantized graph holds."""

import torch
from torch import Tensor, nn

__all__ = ["CorrectedLinear"]


class CorrectedLinear(nn.Module):
    """Linear(D→K) from `levels` (K × D), `scales` (K × blocks), `block`, `divisor` (D,), `left` (D × r),
    `right` (r × K) and `bias` (K,) or None."""

    def __init__(
        self,
        levels: Tensor,
        scales: Tensor,
        block: int,
        divisor: Tensor,
        left: Tensor,
        right: Tensor,
        bias: Tensor | None = None,
    ):
        super().__init__()
        k, d = levels.shape
        if scales.shape != (k, -(-d // block)) or divisor.shape != (d,):
            raise ValueError(
                f"levels {tuple(levels.shape)} in blocks of {block} take scales ({k}, {-(-d // block)}) and a divisor "
                f"({d},), got {tuple(scales.shape)} and {tuple(divisor.shape)}"
            )
        if left.shape != (d, right.shape[0]) or right.shape[1] != k:
            raise ValueError(
                f"a correction of a {(k, d)} weight is ({d} × r, r × {k}), "
                f"got {tuple(left.shape)} and {tuple(right.shape)}"
            )
        self.block = block
        self.register_buffer("levels", levels.detach().clone())  # (K, D), integers, frozen
        self.register_buffer("scales", scales.detach().clone())  # (K, blocks)
        self.register_buffer("divisor", divisor.detach().clone())  # (D,)
        self.gain = nn.Parameter(torch.ones_like(scales))  # (K, blocks): the trained scales are scales · gain
        self.left = nn.Parameter(left.detach().clone())  # (D, r)
        self.right = nn.Parameter(right.detach().clone())  # (r, K)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())

    def rounded(self) -> Tensor:
        """Q (K × D): the weight as the graph rounds it, at the current scales."""
        per_block = (self.scales * self.gain).repeat_interleave(self.block, dim=1)[:, : self.levels.shape[1]]
        return self.levels * per_block / self.divisor  # (K, D)

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.linear(x, self.rounded(), self.bias) + (x @ self.left) @ self.right  # (…, K)

    def to_dense(self) -> Tensor:
        """The weight (K × D) the layer multiplies by: Q + (A B)ᵀ."""
        return self.rounded() + (self.left @ self.right).T

    @property
    def rank(self) -> int:
        return self.right.shape[0]

    def extra_repr(self) -> str:
        k, d = self.levels.shape
        return f"in_features={d}, out_features={k}, block={self.block}, rank={self.rank}"
