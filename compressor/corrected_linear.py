"""A rounded linear layer with a trainable low-rank correction of its rounding error:
y = x (Q ⊙ G)ᵀ + b + (x A) B, Q (K × D) the weight as a quantizer rounded it (frozen), A (D × r) and B (r × K)
the correction, so that W ≈ Q ⊙ G + (A B)ᵀ; G, with a `block`, one gain a block of `block` inputs of an output
(init 1: Q's block scales times G, its codes unchanged), else 1. Training A, B, G (and b) against the unrounded
model is training through the rounding: the forward pass sees the weights the quantized graph will hold."""

import torch
from torch import Tensor, nn

__all__ = ["CorrectedLinear"]


def _scaled(rounded: Tensor, gain: Tensor, block: int) -> Tensor:
    """Q ⊙ G, G (K × blocks) one gain a block of `block` inputs."""
    return rounded * gain.repeat_interleave(block, dim=1)[:, : rounded.shape[1]]


class _GainedLinear(torch.autograd.Function):
    """x (Q ⊙ G)ᵀ with its weight made again in the backward, not kept from the forward: kept, every layer's was a
    copy of the model's weights (2 GB at 0.5B) through each step. ∂/∂x = g (Q ⊙ G); ∂/∂G = the sums over each
    block of (gᵀ x) ⊙ Q."""

    @staticmethod
    def forward(ctx, x: Tensor, gain: Tensor, rounded: Tensor, block: int) -> Tensor:
        ctx.block = block
        ctx.save_for_backward(x, gain, rounded)
        return nn.functional.linear(x, _scaled(rounded, gain, block))

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, gain, rounded = ctx.saved_tensors
        block = ctx.block
        # in the dtypes of the forward's inputs: under a GPU's bf16 autocast, g and x are bf16 and Q and G float32
        weight = _scaled(rounded, gain, block)
        grad_x = (grad @ weight.to(grad.dtype)).to(x.dtype) if ctx.needs_input_grad[0] else None
        grad_gain = None
        if ctx.needs_input_grad[1]:
            product = grad.reshape(-1, grad.shape[-1]).T.float() @ x.reshape(-1, x.shape[-1]).float()  # ∂/∂(Q ⊙ G)
            product = nn.functional.pad(product.mul_(rounded), (0, gain.shape[1] * block - product.shape[1]))
            grad_gain = product.view(*gain.shape, block).sum(-1).to(gain.dtype)
        return grad_x, grad_gain, None, None


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
        return self.rounded if self.gain is None else _scaled(self.rounded, self.gain, self.block)

    def forward(self, x: Tensor) -> Tensor:
        if self.gain is None:
            product = nn.functional.linear(x, self.rounded)
        else:
            product = _GainedLinear.apply(x, self.gain, self.rounded, self.block)
        out = product + (x @ self.left) @ self.right  # (…, K)
        return out if self.bias is None else out + self.bias

    def to_dense(self) -> Tensor:
        """The weight (K × D) the layer multiplies by: Q ⊙ G + (A B)ᵀ."""
        return self.scaled() + (self.left @ self.right).T

    @property
    def rank(self) -> int:
        return self.right.shape[0]

    def extra_repr(self) -> str:
        gains = "" if self.block is None else f", gains in blocks of {self.block}"
        return f"in_features={self.rounded.shape[1]}, out_features={self.rounded.shape[0]}, rank={self.rank}{gains}"
