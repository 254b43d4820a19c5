"""A rounded linear layer with a trainable low-rank correction of its rounding error:
y = x (Q ⊙ G)ᵀ + b + (x A) B, Q (K × D) the weight as a quantizer rounded it (frozen), A (D × r) and B (r × K)
the correction, so that W ≈ Q ⊙ G + (A B)ᵀ; G, with a `block`, one gain a block of `block` inputs of an output
(init 1: Q's block scales times G, its codes unchanged), else 1. Training A, B, G (and b) against the unrounded
model is training through the rounding: the forward pass sees the weights the quantized graph will hold."""

import torch
from torch import Tensor, nn

__all__ = ["CorrectedLinear"]


class CorrectedLinear(nn.Module):
    """Linear(D→K) whose weight is the frozen rounded `rounded` (K × D), its blocks of `block` inputs scaled by
    trainable gains (`block` None: none), plus `left` @ `right` (D × r, r × K; r may be 0) transposed; `bias`
    (K,) or None."""

    def __init__(
        self, rounded: Tensor, left: Tensor, right: Tensor, bias: Tensor | None = None, block: int | None = None
    ):
        super().__init__()
        if rounded.dim() != 2 or left.shape != (rounded.shape[1], right.shape[0]) or right.shape[1] != rounded.shape[0]:
            raise ValueError(
                f"a correction of a {tuple(rounded.shape)} weight is (D × r, r × K) = ({rounded.shape[1]} × r, "
                f"r × {rounded.shape[0]}), got {tuple(left.shape)} and {tuple(right.shape)}"
            )
        self.register_buffer("rounded", rounded.detach().clone())  # (K, D), frozen
        self.left = nn.Parameter(left.detach().clone())  # (D, r)
        self.right = nn.Parameter(right.detach().clone())  # (r, K)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        self.block = block
        blocks = None if block is None else -(-rounded.shape[1] // block)
        self.gain = None if block is None else nn.Parameter(torch.ones(rounded.shape[0], blocks))  # (K, blocks)

    def scaled(self) -> Tensor:
        """Q ⊙ G (K × D): the rounded weight, each block's scale times its gain."""
        if self.gain is None:
            return self.rounded
        return self.rounded * self.gain.repeat_interleave(self.block, dim=1)[:, : self.rounded.shape[1]]

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.linear(x, self.scaled(), self.bias) + (x @ self.left) @ self.right  # (…, K)

    def to_dense(self) -> Tensor:
        """The weight (K × D) the layer multiplies by: Q ⊙ G + (A B)ᵀ."""
        return self.scaled() + (self.left @ self.right).T

    @property
    def rank(self) -> int:
        return self.right.shape[0]

    def extra_repr(self) -> str:
        gains = "" if self.block is None else f", gains in blocks of {self.block}"
        return f"in_features={self.rounded.shape[1]}, out_features={self.rounded.shape[0]}, rank={self.rank}{gains}"
