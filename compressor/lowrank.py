"""Low-rank factorizations of a weight W (K×D): plain SVD, and activation-aware (SVD-LLM):
with calibration inputs X (N×D) and S = chol(XᵀX + λI), the SVD of W S truncated at r gives
W' = U_r Σ_r V_rᵀ S⁻¹, the rank-r matrix that minimises ‖(W − W') Xᵀ‖_F."""

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from compressor.errors import ShapeError
from compressor.ranks import check_rank

__all__ = ["LowRankFactors", "svd_factors", "whitened_factors", "weighted_row_factors", "cholesky_whitener"]


@dataclass(frozen=True)
class LowRankFactors:
    """W ≈ up @ down, up (K×r) = U_r Σ_r^{1/2}, down (r×D); `spectrum` holds every singular value
    of the (whitened/weighted) matrix, so any lower rank's error is known without a new SVD."""

    up: Tensor
    down: Tensor
    spectrum: Tensor

    @property
    def rank(self) -> int:
        return self.up.shape[1]


def _split(u: Tensor, s: Tensor, vh: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    root = s[:rank].sqrt()
    return u[:, :rank] * root, root[:, None] * vh[:rank]


def _clamp(rank: int, w: Tensor) -> int:
    rank = check_rank(rank)
    full = min(w.shape)
    if rank > full:
        warnings.warn(f"rank {rank} is more than a {tuple(w.shape)} matrix allows; clamped to {full}", stacklevel=3)
    return min(rank, full)


def svd_factors(weight: Tensor, rank: int) -> LowRankFactors:
    """Truncated SVD: the rank-r matrix nearest W in Frobenius norm."""
    w = weight.detach().to(torch.float64)
    rank = _clamp(rank, w)
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    up, down = _split(u, s, vh, rank)
    return LowRankFactors(up.to(weight.dtype), down.to(weight.dtype), s)


def cholesky_whitener(gram: Tensor, damp: float = 1e-6) -> tuple[Tensor, float]:
    """(S, λ) with S lower-triangular, S Sᵀ = XᵀX + λI. λ starts at damp·mean(diag) and grows
    tenfold until the factorization succeeds (a singular Gram needs some)."""
    g = gram.detach().to(torch.float64)
    if g.ndim != 2 or g.shape[0] != g.shape[1]:
        raise ShapeError(f"a Gram matrix must be square, got shape {tuple(g.shape)}")
    scale = float(torch.diagonal(g).mean().clamp_min(1e-30))
    eye = torch.eye(g.shape[0], dtype=g.dtype)
    lam = damp * scale
    for _ in range(12):
        s, info = torch.linalg.cholesky_ex(g + lam * eye)
        if int(info) == 0:
            return s, lam
        lam *= 10
    raise ShapeError("the Gram matrix stays indefinite after regularisation; is the calibration data finite?")


def whitened_factors(weight: Tensor, gram: Tensor, rank: int, damp: float = 1e-6) -> LowRankFactors:
    """Activation-aware truncation: SVD of W S, then down = Σ_r^{1/2} V_rᵀ S⁻¹."""
    w = weight.detach().to(torch.float64)
    if gram.shape != (w.shape[1], w.shape[1]):
        raise ShapeError(f"Gram matrix {tuple(gram.shape)} does not match a layer with {w.shape[1]} inputs")
    rank = _clamp(rank, w)
    s_mat, lam = cholesky_whitener(gram, damp)
    if int(torch.linalg.cholesky_ex(gram.detach().to(torch.float64))[1]) != 0:
        warnings.warn(f"the input Gram matrix is singular; regularised with λ = {lam:.3g}", stacklevel=2)
    u, s, vh = torch.linalg.svd(w @ s_mat, full_matrices=False)
    up, down_white = _split(u, s, vh, rank)
    down = torch.linalg.solve_triangular(s_mat, down_white, upper=False, left=False)  # (Σ^{1/2} Vᵀ) S⁻¹
    return LowRankFactors(up.to(weight.dtype), down.to(weight.dtype), s)


def weighted_row_factors(weight: Tensor, row_weights: Tensor, rank: int) -> LowRankFactors:
    """Truncated SVD of diag(√f) W, unscaled after: the rank-r fit minimising Σ_i f_i ‖w_i − w'_i‖²
    (rows of frequent tokens are fitted first). f must be positive."""
    w = weight.detach().to(torch.float64)
    f = row_weights.detach().to(torch.float64)
    if f.shape != (w.shape[0],) or not bool((f > 0).all()):
        raise ShapeError(f"row weights must be {w.shape[0]} positive numbers, got shape {tuple(f.shape)}")
    rank = _clamp(rank, w)
    root = f.sqrt()[:, None]
    u, s, vh = torch.linalg.svd(w * root, full_matrices=False)
    up, down = _split(u, s, vh, rank)
    return LowRankFactors((up / root).to(weight.dtype), down.to(weight.dtype), s)
