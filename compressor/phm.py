"""The nearest Kronecker sum of a weight W (K×D) (Van Loan–Pitsianis): H = Σ_{i=1}^{t} A_i ⊗ S_i with
A_i (n×n) and S_i ((K/n)×(D/n)). Block (a, b) of H is Σ_i A_i[a,b] S_i, so the block rearrangement
R(W), whose row a·n+b is vec(W_{a,b}), turns H into the rank-t matrix Σ_i vec(A_i) vec(S_i)ᵀ: the
truncated SVD of R(W) is the best t-term fit in Frobenius norm, exact at t = n² terms."""

import math
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from compressor.errors import RankError, ShapeError

__all__ = [
    "KronSumFactors",
    "check_block_count",
    "check_block_size",
    "check_terms",
    "kron_rearrange",
    "kron_sum_factors",
    "kron_sum_to_dense",
    "balance_terms",
]


@dataclass(frozen=True)
class KronSumFactors:
    """W ≈ Σ_i a[i] ⊗ s[i]; `spectrum` holds every singular value of R(W), so the Frobenius error of
    any number of terms t is known without a new SVD: ‖W − H_t‖² = Σ_{j>t} σ_j²."""

    a: Tensor  # (t, n, n)
    s: Tensor  # (t, K/n, D/n)
    spectrum: Tensor

    @property
    def terms(self) -> int:
        return self.a.shape[0]


def check_block_count(n: object) -> int:
    """Return `n` as an int; the block size of a Kronecker sum is an integer ≥ 2 (n = 1 is W itself)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ShapeError(f"the PHM block size n must be an integer ≥ 2, got {n!r}")
    if n == 1:
        raise ShapeError("n = 1 is the dense layer itself (A_1 = [1], S_1 = W) and saves nothing; choose n ≥ 2")
    return n


def check_block_size(rows: int, cols: int, n: object) -> int:
    """Return `n` as an int; it must be an integer ≥ 2 that divides both dimensions of the weight."""
    check_block_count(n)
    if rows % n == 0 and cols % n == 0:
        return n
    gcd = math.gcd(rows, cols)
    common = [d for d in range(2, gcd + 1) if gcd % d == 0][:8]
    would = f"n = {', '.join(map(str, common))} would" if common else "no n ≥ 2 divides both"
    raise ShapeError(f"the PHM block size n = {n} must divide both dimensions of a {rows}×{cols} weight; {would}")


def check_terms(terms: object, n: int) -> int:
    """Return `terms` as an int; a Kronecker sum has from 1 to n² terms (n² is exact)."""
    if isinstance(terms, bool) or not isinstance(terms, int) or not 1 <= terms <= n * n:
        raise RankError(f"the number of Kronecker terms must be an integer from 1 to n² = {n * n}, got {terms!r}")
    return terms


def kron_rearrange(weight: Tensor, n: int) -> Tensor:
    """R(W) (n² × KD/n²): row a·n+b is the block W_{a,b} = W[a·K/n:(a+1)·K/n, b·D/n:(b+1)·D/n], flattened."""
    rows, cols = weight.shape
    check_block_size(rows, cols, n)
    blocks = weight.reshape(n, rows // n, n, cols // n)  # (a, r, b, c)
    return blocks.permute(0, 2, 1, 3).reshape(n * n, -1)


def kron_sum_to_dense(a: Tensor, s: Tensor) -> Tensor:
    """Σ_i a[i] ⊗ s[i]: (t, n, n) and (t, p, q) → (n·p, n·q)."""
    t, n, _ = a.shape
    _, p, q = s.shape
    return torch.einsum("iab,irc->arbc", a, s).reshape(n * p, n * q)


def balance_terms(a: Tensor, s: Tensor) -> tuple[Tensor, Tensor]:
    """The same sum with a[i] and s[i] at the same root-mean-square entry for every term i (a[i]·c,
    s[i]/c): one learning rate then moves both factors by the same relative step."""
    rms_a = a.pow(2).mean(dim=(1, 2)).sqrt()
    rms_s = s.pow(2).mean(dim=(1, 2)).sqrt()
    scale = torch.where((rms_a > 0) & (rms_s > 0), (rms_s / rms_a.clamp_min(1e-300)).sqrt(), torch.ones_like(rms_a))
    return a * scale[:, None, None], s / scale[:, None, None]


def kron_sum_factors(weight: Tensor, n: int, terms: int) -> KronSumFactors:
    """The `terms`-term Kronecker sum nearest W in Frobenius norm: R(W) = Σ σ_j u_j v_jᵀ, A_i = √σ_i
    unvec(u_i), S_i = √σ_i unvec(v_i), then balanced. R(W) has rank ≤ min(n², KD/n²); terms beyond
    it are clamped (with a warning), since they would be zero."""
    w = weight.detach().to(torch.float64)
    rows, cols = w.shape
    check_block_size(rows, cols, n)
    check_terms(terms, n)
    u, sigma, vh = torch.linalg.svd(kron_rearrange(w, n), full_matrices=False)
    if terms > len(sigma):
        what = f"{terms} Kronecker terms are more than a {rows}×{cols} weight allows at n = {n}"
        warnings.warn(f"{what}; clamped to {len(sigma)}", stacklevel=2)
        terms = len(sigma)
    root = sigma[:terms].sqrt()
    a = (u[:, :terms] * root).T.reshape(terms, n, n)
    s = (root[:, None] * vh[:terms]).reshape(terms, rows // n, cols // n)
    a, s = balance_terms(a, s)
    return KronSumFactors(a.to(weight.dtype), s.to(weight.dtype), sigma)
