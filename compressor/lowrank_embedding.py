"""An embedding table held as W ≈ A B: Embedding(V, r) then Linear(r, D), optionally fitted
with row weights (token frequencies) so that the error falls on rare tokens."""

from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from compressor.compact_embedding import CompactEmbedding
from compressor.lowrank import svd_factors, weighted_row_factors
from compressor.tied_logits import matmul_t

__all__ = ["LowRankEmbedding", "LowRankEmbeddingSpec"]


@dataclass(frozen=True)
class LowRankEmbeddingSpec:
    num_embeddings: int
    embedding_dim: int
    rank: int

    def to_dict(self) -> dict:
        return asdict(self)


class LowRankEmbedding(CompactEmbedding):
    """Row i is codes[i] @ basis: a Gather from a V×r table, then one MatMul with r×D."""

    spec_type = LowRankEmbeddingSpec

    def __init__(self, spec: LowRankEmbeddingSpec):
        super().__init__()
        self.spec = spec
        self.codes = nn.Parameter(torch.zeros(spec.num_embeddings, spec.rank))  # A (V, r)
        self.basis = nn.Parameter(torch.zeros(spec.rank, spec.embedding_dim))  # B (r, D)

    @classmethod
    def from_weight(
        cls, weight: Tensor, rank: int, row_weights: Tensor | None = None, sensitivity: Tensor | None = None
    ) -> "LowRankEmbedding":
        """Truncated SVD of the table; of diag(√f) W when row weights f are given, and of
        diag(√f) W L (L Lᵀ = F) when the output sensitivity F is given as well."""
        if row_weights is None:
            factors = svd_factors(weight, rank)
        else:
            factors = weighted_row_factors(weight, row_weights, rank, sensitivity)
        spec = LowRankEmbeddingSpec(weight.shape[0], weight.shape[1], factors.rank)
        module = cls(spec).to(device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            module.codes.copy_(factors.up)
            module.basis.copy_(factors.down)
        return module

    def to_dense(self) -> Tensor:
        return self.codes @ self.basis

    def forward(self, ids: Tensor) -> Tensor:
        return torch.matmul(self.codes[ids], self.basis)  # (..., r) @ (r, D)

    def logits(self, h: Tensor) -> Tensor:
        """h Wᵀ = (h Bᵀ) Aᵀ through the factors: r(D + V) multiply-adds per row instead of DV."""
        return matmul_t(matmul_t(h, self.basis), self.codes)  # (..., r) then (..., V)

    def row_norms(self) -> Tensor:
        """‖a_i B‖ = √(a_i (B Bᵀ) a_iᵀ) for every row: V r² + r² D multiply-adds, W never formed."""
        gram = self.basis @ self.basis.T  # (r, r)
        return ((self.codes @ gram) * self.codes).sum(-1).clamp_min(0).sqrt()  # (V,)

    def extra_repr(self) -> str:
        s = self.spec
        return f"{s.num_embeddings}, {s.embedding_dim}, rank={s.rank}"
