"""An embedding table held as TT-matrix cores, looked up without forming the table.

Row p of the (padded) table is TT(i_1,…,i_d) = G_1[i_1] G_2[i_2] … G_d[i_d] with
p = Σ_k i_k Π_{j>k} v_j; token t sits at row p = perm[t] (identity when no order was chosen).
"""

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from compressor.compact_embedding import CompactEmbedding
from compressor.errors import ShapeError
from compressor.factorize import balanced_factors
from compressor.lowrank import SENSITIVITY_DAMP
from compressor.tied_logits import matmul_t
from compressor.token_order import TOKEN_ORDERS, principal_order
from compressor.tt import balance_cores, tt2_weighted_als, tt_matrix_svd, tt_matrix_to_dense, tt_refit_under_metric

__all__ = ["TTEmbedding", "TTEmbeddingSpec"]


@dataclass(frozen=True)
class TTEmbeddingSpec:
    """Everything needed to rebuild a TTEmbedding's structure before loading its weights."""

    num_embeddings: int
    embedding_dim: int
    row_dims: tuple[int, ...]
    col_dims: tuple[int, ...]
    ranks: tuple[int, ...]  # r_1 … r_{d-1}
    permuted: bool

    def __post_init__(self):
        object.__setattr__(self, "row_dims", tuple(self.row_dims))
        object.__setattr__(self, "col_dims", tuple(self.col_dims))
        object.__setattr__(self, "ranks", tuple(self.ranks))
        if len(self.row_dims) != len(self.col_dims) or len(self.ranks) != len(self.row_dims) - 1:
            raise ShapeError(f"inconsistent TT spec: {self}")
        if math.prod(self.row_dims) < self.num_embeddings or math.prod(self.col_dims) < self.embedding_dim:
            raise ShapeError(f"TT factors do not cover the table: {self}")

    def to_dict(self) -> dict:
        return asdict(self)


class TTEmbedding(CompactEmbedding):
    """Embedding(V, D) as d TT cores, each stored token-axis first, (v_k, r_{k-1}, d_k, r_k),
    so that one Gather takes every token's slice; the lookup is then d−1 batched matmuls."""

    spec_type = TTEmbeddingSpec

    def __init__(self, spec: TTEmbeddingSpec):
        super().__init__()
        self.spec = spec
        r = [1, *spec.ranks, 1]
        self.cores = nn.ParameterList(
            nn.Parameter(torch.zeros(v, r[k], d, r[k + 1]))
            for k, (v, d) in enumerate(zip(spec.row_dims, spec.col_dims))
        )
        if spec.permuted:
            self.register_buffer("permutation", torch.arange(spec.num_embeddings))
        self._strides = [math.prod(spec.row_dims[k + 1 :]) for k in range(len(spec.row_dims))]

    @classmethod
    def from_embedding(
        cls,
        embedding: nn.Embedding,
        rank: int | None = 32,
        rel_eps: float | None = None,
        num_cores: int = 2,
        order: str = "none",
    ) -> "TTEmbedding":
        """TT-SVD of a trained nn.Embedding's table (see from_weight)."""
        return cls.from_weight(embedding.weight, rank, rel_eps, num_cores, order)

    @classmethod
    def from_weight(
        cls,
        weight: Tensor,
        rank: int | None = 32,
        rel_eps: float | None = None,
        num_cores: int = 2,
        order: str = "none",
        row_weights: Tensor | None = None,
        sensitivity: Tensor | None = None,
    ) -> "TTEmbedding":
        """TT-SVD of a (V, D) table, truncated by `rank` and/or `rel_eps`, in `order`; with
        `row_weights` f (one per token, two cores) then refitted to minimise Σ_t f_t ‖w_t − TT_t‖²,
        and with the output `sensitivity` F (D × D) as well, to Σ_t f_t δ_tᵀ (F + μI) δ_t (Adam);
        the cores are balanced (equal rms entry) so that a fine-tune moves them alike."""
        if order not in TOKEN_ORDERS:
            raise ShapeError(f"token order must be one of {TOKEN_ORDERS}, got {order!r}")
        weight = weight.detach()
        num, dim = weight.shape
        row_dims, col_dims = balanced_factors(num, num_cores), balanced_factors(dim, num_cores)
        padded = weight.new_zeros(math.prod(row_dims), math.prod(col_dims))
        perm = principal_order(weight) if order == "pca" else torch.arange(num)
        padded[perm, :dim] = weight
        cores = tt_matrix_svd(padded, row_dims, col_dims, max_rank=rank, rel_eps=rel_eps)
        if row_weights is not None:
            if row_weights.shape != (num,):
                raise ShapeError(f"row weights must be one per token ({num}), got shape {tuple(row_weights.shape)}")
            padded_weights = row_weights.new_zeros(len(padded), dtype=torch.float64)
            padded_weights[perm] = row_weights.to(torch.float64)  # padding rows weigh nothing
            cores = tt2_weighted_als(cores, padded, padded_weights)
        cores = balance_cores(cores)
        if sensitivity is not None:
            if row_weights is None or sensitivity.shape != (dim, dim):
                raise ShapeError(f"an output sensitivity must be ({dim}, {dim}) and come with row weights")
            damp = SENSITIVITY_DAMP * sensitivity.diagonal().mean().clamp_min(1e-30)
            metric = sensitivity.to(torch.float64) + damp * torch.eye(dim, dtype=torch.float64)
            cores = balance_cores(tt_refit_under_metric(cores, padded, padded_weights, metric))
        spec = TTEmbeddingSpec(num, dim, row_dims, col_dims, tuple(c.shape[-1] for c in cores[:-1]), order != "none")
        module = cls(spec).to(device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            for param, core in zip(module.cores, cores):
                param.copy_(core.permute(1, 0, 2, 3))
            if spec.permuted:
                module.permutation.copy_(perm)
        return module

    @property
    def weight_like_params(self) -> int:
        """Floats held by the cores: Σ_k r_{k-1} v_k d_k r_k."""
        return sum(c.numel() for c in self.cores)

    def to_dense(self) -> Tensor:
        """The (V, D) table in token order (for checks; forward never builds it)."""
        table = tt_matrix_to_dense([c.permute(1, 0, 2, 3) for c in self.cores])
        rows = self.permutation if self.spec.permuted else slice(0, self.num_embeddings)
        return table[rows, : self.embedding_dim]

    def forward(self, ids: Tensor) -> Tensor:
        rows = self.permutation[ids] if self.spec.permuted else ids
        rows = rows.reshape(-1)  # (N,)
        last = len(self.cores) - 1
        x = None
        for k, core in enumerate(self.cores):
            v, r0, d, r1 = core.shape
            i_k = rows // self._strides[k] if k == 0 else (rows // self._strides[k]) % v
            g = core.reshape(v, r0, d * r1)[i_k]  # (N, r_{k-1}, d_k r_k)
            x = g if x is None else torch.matmul(x, g)  # (N, Π_{j<k} d_j, d_k r_k)
            if k < last:
                x = x.reshape(x.shape[0], -1, r1)  # (N, Π_{j≤k} d_j, r_k)
        padded_dim = math.prod(self.spec.col_dims)
        out = x.reshape(*ids.shape, padded_dim)  # (..., D')
        return out if padded_dim == self.embedding_dim else out[..., : self.embedding_dim]

    def logits(self, h: Tensor) -> Tensor:
        """h Wᵀ through the cores, never forming W: h (N, D') is cut into (d_1, …, d_d) and contracted
        with G_1, …, G_d in turn, T[n, (i_1…i_k), r_k, rest] = Σ_{r_{k−1}, a} T[n, (i_1…i_{k−1}), r_{k−1}, a,
        rest] G_k[i_k, r_{k−1}, a, r_k], one matrix product per core: N Σ_k (Π_{j<k} v_j) r_{k−1} d_k v_k r_k
        (Π_{j>k} d_j) multiply-adds, which beats the dense N V D only at small ranks."""
        padded_dim = math.prod(self.spec.col_dims)
        if padded_dim > self.embedding_dim:
            h = nn.functional.pad(h, (0, padded_dim - self.embedding_dim))
        lead = h.shape[:-1]
        x = h.reshape(-1, 1, 1, padded_dim)  # (N, P = Π v so far, r_{k−1}, d_k · rest)
        for core in self.cores:
            v, r0, d, r1 = core.shape
            n, p = x.shape[0], x.shape[1]
            x = x.reshape(n, p, r0, d, -1).permute(0, 1, 4, 2, 3)  # (N, P, rest, r_{k−1}, d_k)
            rest = x.shape[2]
            kernel = core.permute(0, 3, 1, 2).reshape(v * r1, r0 * d)  # [(i, r_k), (r_{k−1}, a)]
            x = matmul_t(x.reshape(-1, r0 * d), kernel)  # (N·P·rest, v_k·r_k)
            x = x.reshape(n, p, rest, v, r1).permute(0, 1, 3, 4, 2)  # (N, P, v_k, r_k, rest)
            x = x.reshape(n, p * v, r1, rest)
        rows = x.reshape(*lead, -1)  # (..., V')
        return rows[..., self.permutation] if self.spec.permuted else rows[..., : self.num_embeddings]

    def row_norms(self) -> Tensor:
        """‖row p‖² = Σ over the column indices of (G_1[i_1] … G_d[i_d])², contracted core by core as
        X_k[(i_1…i_k), r_k, r_k'] = Σ X_{k−1}[(i_1…i_{k−1}), r_{k−1}, r_{k−1}'] G_k[i_k, r_{k−1}, a, r_k]
        G_k[i_k, r_{k−1}', a, r_k']: Σ_k (Π_{j≤k} v_j) r_{k−1} d_k r_k (r_{k−1} + r_k) multiply-adds."""
        if math.prod(self.spec.col_dims) > self.embedding_dim:
            raise ShapeError(
                f"row norms of a TT table with padded columns ({self.spec.col_dims} for {self.embedding_dim}) "
                "are not supported"
            )
        x = self.cores[0].new_ones(1, 1, 1)  # (P, r_0, r_0')
        for core in self.cores:
            y = torch.einsum("pab,iacr->pibcr", x, core)  # (P, v, r', d, r)
            x = torch.einsum("pibcr,ibcs->pirs", y, core).flatten(0, 1)  # (P·v, r, r')
        norms = x.reshape(-1).clamp_min(0).sqrt()  # (V',) in row order
        return norms[self.permutation] if self.spec.permuted else norms[: self.num_embeddings]

    def extra_repr(self) -> str:
        s = self.spec
        return (
            f"{s.num_embeddings}, {s.embedding_dim}, rows={s.row_dims}, cols={s.col_dims}, "
            f"ranks={s.ranks}, permuted={s.permuted}"
        )
