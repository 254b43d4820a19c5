"""A linear layer y = W x + b held as a Kronecker sum (PHM, R2D2): W ≈ H = Σ_{i=1}^{t} A_i ⊗ S_i with
A_i (n×n) and S_i ((K/n)×(D/n)), t·(n² + KD/n²) weights instead of KD."""

from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from compressor.dense import dense_weight
from compressor.errors import ShapeError
from compressor.phm import check_block_size, check_terms, kron_sum_factors, kron_sum_to_dense
from compressor.phm_fit import kron_sum_refit

__all__ = ["PHMLinear", "PHMLinearSpec"]


@dataclass(frozen=True)
class PHMLinearSpec:
    in_features: int
    out_features: int
    n: int
    terms: int
    bias: bool

    def __post_init__(self):
        check_block_size(self.out_features, self.in_features, self.n)
        check_terms(self.terms, self.n)

    def to_dict(self) -> dict:
        return asdict(self)


class PHMLinear(nn.Module):
    """Linear(D→K) as Σ_i A_i ⊗ S_i. The forward never forms H: with x cut into n blocks x_b of D/n,
    output block a is Σ_b Σ_i A_i[a,b] (S_i x_b): one MatMul by all S_i stacked, then one batched
    MatMul by the A_i laid out as an (n, n·t) matrix; t·K·D/n + t·n·K multiply-adds per row."""

    spec_type = PHMLinearSpec

    def __init__(self, spec: PHMLinearSpec):
        super().__init__()
        self.spec = spec
        t, n = spec.terms, spec.n
        self.a = nn.Parameter(torch.zeros(t, n, n))  # A_i: how the blocks mix
        self.s = nn.Parameter(torch.zeros(t, spec.out_features // n, spec.in_features // n))  # S_i: the block
        self.bias = nn.Parameter(torch.zeros(spec.out_features)) if spec.bias else None

    @classmethod
    def from_linear(
        cls,
        layer: nn.Module,
        n: int,
        terms: int | None = None,
        gram: Tensor | None = None,
        sensitivity: Tensor | None = None,
    ) -> "PHMLinear":
        """The nearest Kronecker sum of an nn.Linear's (or Conv1D's) weight with `terms` terms (default
        n); with the input Gram XᵀX refitted to the layer's output error on those inputs, and with the
        output sensitivity F as well under ‖Lᵀ (W − H) S‖_F (compressor.phm_fit). Keeps bias, dtype, device."""
        if sensitivity is not None and gram is None:
            raise ShapeError("an output sensitivity refines the fit to calibration inputs; pass their Gram matrix too")
        w = dense_weight(layer).detach()
        factors = kron_sum_factors(w, n, n if terms is None else terms)
        a, s = factors.a, factors.s
        if gram is not None:
            a, s = kron_sum_refit(a, s, w, gram, sensitivity)
        rows, cols = w.shape
        spec = PHMLinearSpec(cols, rows, n, factors.terms, layer.bias is not None)
        module = cls(spec).to(device=w.device, dtype=w.dtype)
        with torch.no_grad():
            module.a.copy_(a)
            module.s.copy_(s)
            if module.bias is not None:
                module.bias.copy_(layer.bias)
        return module

    def to_dense(self) -> Tensor:
        """H = Σ_i A_i ⊗ S_i, (K, D) (for checks; forward never builds it)."""
        return kron_sum_to_dense(self.a, self.s)

    def forward(self, x: Tensor) -> Tensor:
        t, n = self.spec.terms, self.spec.n
        p, q = self.s.shape[1:]
        stacked = self.s.permute(2, 0, 1).reshape(q, t * p)  # column (i, r): row r of S_i
        mixing = self.a.permute(1, 2, 0).reshape(n, n * t)  # [a, (b, i)] = A_i[a, b]
        blocks = x.reshape(-1, q)  # (N·n, D/n): x_b, block b of each row
        y = torch.matmul(blocks, stacked).reshape(-1, n * t, p)  # (N, n·t, K/n): S_i x_b at row (b, i)
        y = torch.matmul(mixing, y)  # (N, n, K/n): output block a
        y = y.reshape(x.shape[:-1] + (n * p,))  # (..., K)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        s = self.spec
        return f"{s.in_features}→{s.out_features}, n={s.n}, terms={s.terms}, bias={s.bias}"
