"""Low-rank factorizations of a weight W (K×D): plain SVD, and activation-aware (SVD-LLM):
with calibration inputs X (N×D) and S = chol(XᵀX + λI), the SVD of W S truncated at r gives
W' = U_r Σ_r V_rᵀ S⁻¹, the rank-r matrix that minimises ‖(W − W') Xᵀ‖_F. Output-aware (K-FAC) adds
the output sensitivity F on the other side: the SVD of Lᵀ W S with L Lᵀ = F."""

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from compressor.errors import ShapeError
from compressor.ranks import check_rank

__all__ = [
    "LowRankFactors",
    "metric_factors",
    "svd_factors",
    "whitened_factors",
    "weighted_row_factors",
    "cholesky_whitener",
    "SENSITIVITY_DAMP",
]

SENSITIVITY_DAMP = 1e-2  # F is estimated from a few random probes: shrink it towards μI


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


def _mapped(w: Tensor, left: Tensor | None, right: Tensor | None) -> Tensor:
    """P W Q, with a 1-D P or Q meaning its diagonal."""
    if left is not None:
        w = left[:, None] * w if left.ndim == 1 else left @ w
    if right is not None:
        w = w * right if right.ndim == 1 else w @ right
    return w


def metric_factors(
    weight: Tensor, rank: int, left: Tensor | None = None, right: Tensor | None = None
) -> LowRankFactors:
    """SVD of P W Q truncated at r, mapped back: W' = P⁻¹ U_r Σ_r V_rᵀ Q⁻¹ is the rank-r matrix that
    minimises ‖P (W − W') Q‖_F. P (K×K) and Q (D×D) are invertible, or 1-D for a diagonal; None is I."""
    w = weight.detach().to(torch.float64)
    rank = _clamp(rank, w)
    left = None if left is None else left.detach().to(torch.float64)
    right = None if right is None else right.detach().to(torch.float64)
    u, s, vh = torch.linalg.svd(_mapped(w, left, right), full_matrices=False)
    up, down = _split(u, s, vh, rank)
    if left is not None:
        up = up / left[:, None] if left.ndim == 1 else torch.linalg.solve(left, up)
    if right is not None:
        down = down / right if right.ndim == 1 else torch.linalg.solve(right, down, left=False)
    return LowRankFactors(up.to(weight.dtype), down.to(weight.dtype), s)


def svd_factors(weight: Tensor, rank: int) -> LowRankFactors:
    """Truncated SVD: the rank-r matrix nearest W in Frobenius norm."""
    return metric_factors(weight, rank)


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


def _sensitivity_root(sensitivity: Tensor | None, size: int) -> Tensor | None:
    """L with L Lᵀ = F + μI (μ = SENSITIVITY_DAMP·mean diag F), or None without F."""
    if sensitivity is None:
        return None
    if sensitivity.shape != (size, size):
        raise ShapeError(f"a sensitivity matrix {tuple(sensitivity.shape)} does not match a layer output of {size}")
    return cholesky_whitener(sensitivity, SENSITIVITY_DAMP)[0]


def whitened_factors(
    weight: Tensor, gram: Tensor, rank: int, damp: float = 1e-6, sensitivity: Tensor | None = None
) -> LowRankFactors:
    """Activation-aware truncation: SVD of W S (S Sᵀ = XᵀX + λI), then down = Σ_r^{1/2} V_rᵀ S⁻¹.
    With the output sensitivity F = E[g gᵀ] (g: the loss gradient at the layer output), SVD of
    Lᵀ W S instead (L Lᵀ = F + μI): then Σ_{j>r} σ_j² ≈ the loss the truncation adds (K-FAC)."""
    w = weight.detach()
    if gram.shape != (w.shape[1], w.shape[1]):
        raise ShapeError(f"Gram matrix {tuple(gram.shape)} does not match a layer with {w.shape[1]} inputs")
    s_mat, lam = cholesky_whitener(gram, damp)
    if int(torch.linalg.cholesky_ex(gram.detach().to(torch.float64))[1]) != 0:
        warnings.warn(f"the input Gram matrix is singular; regularised with λ = {lam:.3g}", stacklevel=2)
    out_root = _sensitivity_root(sensitivity, w.shape[0])
    return metric_factors(weight, rank, None if out_root is None else out_root.T, s_mat)


def weighted_row_factors(
    weight: Tensor, row_weights: Tensor, rank: int, sensitivity: Tensor | None = None
) -> LowRankFactors:
    """Truncated SVD of diag(√f) W, unscaled after: the rank-r fit minimising Σ_i f_i ‖w_i − w'_i‖²
    (rows of frequent tokens are fitted first). f must be positive. With the sensitivity F of the
    embedding's output, diag(√f) W L (L Lᵀ = F + μI): an embedding is a linear layer on one-hot
    inputs, whose Gram is diag(counts)."""
    f = row_weights.detach().to(torch.float64)
    if f.shape != (weight.shape[0],) or not bool((f > 0).all()):
        raise ShapeError(f"row weights must be {weight.shape[0]} positive numbers, got shape {tuple(f.shape)}")
    return metric_factors(weight, rank, f.sqrt(), _sensitivity_root(sensitivity, weight.shape[1]))
