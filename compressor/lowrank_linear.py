"""A linear layer y = W x + b held as two factors, W ≈ up · down: x → down x (r) → up(·) + b."""

from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from compressor.dense import dense_weight
from compressor.lowrank import LowRankFactors, svd_factors, whitened_factors

__all__ = ["LowRankLinear", "LowRankLinearSpec"]


@dataclass(frozen=True)
class LowRankLinearSpec:
    in_features: int
    out_features: int
    rank: int
    bias: bool

    def to_dict(self) -> dict:
        return asdict(self)


class LowRankLinear(nn.Module):
    """Linear(D→K) as Linear(D→r, no bias) then Linear(r→K, bias): r(K+D) weights instead of KD;
    in ONNX two MatMuls (and an Add)."""

    spec_type = LowRankLinearSpec

    def __init__(self, spec: LowRankLinearSpec):
        super().__init__()
        self.spec = spec
        self.down = nn.Parameter(torch.zeros(spec.rank, spec.in_features))  # (r, D)
        self.up = nn.Parameter(torch.zeros(spec.out_features, spec.rank))  # (K, r)
        self.bias = nn.Parameter(torch.zeros(spec.out_features)) if spec.bias else None

    @classmethod
    def from_factors(cls, linear: nn.Module, factors: LowRankFactors) -> "LowRankLinear":
        """The layer `linear` (an nn.Linear or a Hugging Face Conv1D) as `factors`, its bias kept."""
        rows, cols = dense_weight(linear).shape
        spec = LowRankLinearSpec(cols, rows, factors.rank, linear.bias is not None)
        module = cls(spec).to(device=linear.weight.device, dtype=linear.weight.dtype)
        with torch.no_grad():
            module.down.copy_(factors.down)
            module.up.copy_(factors.up)
            if module.bias is not None:
                module.bias.copy_(linear.bias)
        return module

    @classmethod
    def from_linear(
        cls, linear: nn.Module, rank: int, gram: Tensor | None = None, sensitivity: Tensor | None = None
    ) -> "LowRankLinear":
        """Plain truncated SVD; activation-aware when the input Gram matrix XᵀX is given, and
        output-aware too when the output sensitivity F = E[g gᵀ] is given as well."""
        w = dense_weight(linear)
        if gram is None:
            return cls.from_factors(linear, svd_factors(w, rank))
        return cls.from_factors(linear, whitened_factors(w, gram, rank, sensitivity=sensitivity))

    def to_dense(self) -> Tensor:
        """W' = up · down, (K, D)."""
        return self.up @ self.down

    def forward(self, x: Tensor) -> Tensor:
        h = torch.matmul(x, self.down.T)  # (..., r)
        y = torch.matmul(h, self.up.T)  # (..., K)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        s = self.spec
        return f"{s.in_features}→{s.rank}→{s.out_features}, bias={s.bias}"
