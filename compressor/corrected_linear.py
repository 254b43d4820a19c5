"""A rounded linear layer with a trainable low-rank correction of its rounding error:
y = x Qᵀ + b + (x A) B, Q (K × D) the weight as a quantizer rounded it (frozen), A (D × r) and B (r × K)
the correction, so that W ≈ Q + (A B)ᵀ. Training A and B (and b) against the unrounded model is
training through the rounding: the forward pass sees the weights the quantized graph will hold."""

from torch import Tensor, nn

__all__ = ["CorrectedLinear"]


class CorrectedLinear(nn.Module):
    """Linear(D→K) whose weight is the frozen rounded `rounded` (K × D) plus `left` @ `right` (D × r, r × K)
    transposed; `bias` (K,) or None."""

    def __init__(self, rounded: Tensor, left: Tensor, right: Tensor, bias: Tensor | None = None):
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

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.linear(x, self.rounded, self.bias) + (x @ self.left) @ self.right  # (…, K)

    def to_dense(self) -> Tensor:
        """The weight (K × D) the layer multiplies by: Q + (A B)ᵀ."""
        return self.rounded + (self.left @ self.right).T

    @property
    def rank(self) -> int:
        return self.right.shape[0]

    def extra_repr(self) -> str:
        return f"in_features={self.rounded.shape[1]}, out_features={self.rounded.shape[0]}, rank={self.rank}"
