"""TT-SVD of a matrix into TT-matrix cores (Oseledets 2011), and back.

W (Πv × Πd) is reshaped to (v_1,…,v_d, d_1,…,d_d), interleaved to (v_1 d_1, …, v_d d_d) and
split by successive truncated SVDs into cores G_k ∈ R^{r_{k-1}×v_k×d_k×r_k}, r_0 = r_d = 1, with
‖W − TT(W)‖_F ≤ ε‖W‖_F when each of the d−1 steps drops at most ε‖W‖_F/√(d−1).
"""

import math

import torch
from torch import Tensor
from tqdm.auto import tqdm

from compressor.errors import ShapeError
from compressor.ranks import check_rank, check_rel_eps, clamp_ranks

__all__ = [
    "balance_cores",
    "tt_full_ranks",
    "tt_matrix_svd",
    "tt_matrix_to_dense",
    "tt_params",
    "tt2_weighted_als",
    "tt_refit_under_metric",
]


def tt_full_ranks(row_dims: tuple[int, ...], col_dims: tuple[int, ...]) -> list[int]:
    """Ranks r_1..r_{d-1} at which TT-SVD is exact: min(Π_{j≤k} v_j d_j, Π_{j>k} v_j d_j)."""
    sizes = [v * d for v, d in zip(row_dims, col_dims, strict=True)]
    return [min(math.prod(sizes[: k + 1]), math.prod(sizes[k + 1 :])) for k in range(len(sizes) - 1)]


def tt_params(row_dims, col_dims, ranks) -> int:
    """Σ_k r_{k-1} v_k d_k r_k for bond ranks r_1..r_{d-1}."""
    r = [1, *ranks, 1]
    return sum(r[k] * v * d * r[k + 1] for k, (v, d) in enumerate(zip(row_dims, col_dims)))


def _kept_rank(s: Tensor, max_rank: int, tail_budget: float) -> int:
    """Smallest rank ≤ max_rank whose dropped singular values have norm ≤ tail_budget."""
    tail = torch.cumsum(s.flip(0) ** 2, 0).flip(0)  # tail[i] = Σ_{j≥i} s_j²
    fits = (tail <= tail_budget**2).nonzero()
    by_error = int(fits[0]) if len(fits) else len(s)
    return max(1, min(max_rank, by_error))


def tt_matrix_svd(
    matrix: Tensor,
    row_dims: tuple[int, ...],
    col_dims: tuple[int, ...],
    max_rank: int | None = None,
    rel_eps: float | None = None,
) -> list[Tensor]:
    """Cores G_k (r_{k-1}, v_k, d_k, r_k) of `matrix` (Πv × Πd), truncated by rank and/or ε."""
    d = len(row_dims)
    if len(col_dims) != d or d < 2:
        raise ShapeError(f"row and column factors must have the same length ≥ 2, got {row_dims} and {col_dims}")
    if tuple(matrix.shape) != (math.prod(row_dims), math.prod(col_dims)):
        raise ShapeError(f"matrix of shape {tuple(matrix.shape)} does not match factors {row_dims} × {col_dims}")
    full = tt_full_ranks(row_dims, col_dims)
    bounds = full if max_rank is None else clamp_ranks(check_rank(max_rank), full, "TT-SVD")
    eps = 0.0 if rel_eps is None else check_rel_eps(rel_eps)

    x = matrix.detach().to(torch.float64)
    step_budget = eps * float(torch.linalg.norm(x)) / math.sqrt(d - 1)
    x = x.reshape(*row_dims, *col_dims)
    x = x.permute([j for k in range(d) for j in (k, d + k)])  # (v_1, d_1, …, v_d, d_d)

    cores, r_prev = [], 1
    rest = x.reshape(-1)
    for k in range(d - 1):
        unfolding = rest.reshape(r_prev * row_dims[k] * col_dims[k], -1)
        u, s, vh = torch.linalg.svd(unfolding, full_matrices=False)
        r = _kept_rank(s, bounds[k], step_budget)
        cores.append(u[:, :r].reshape(r_prev, row_dims[k], col_dims[k], r))
        rest = s[:r, None] * vh[:r]  # (r, rest)
        r_prev = r
    cores.append(rest.reshape(r_prev, row_dims[-1], col_dims[-1], 1))
    return [c.to(matrix.dtype).contiguous() for c in cores]


def balance_cores(cores: list[Tensor]) -> list[Tensor]:
    """The same TT with every core at the same root-mean-square entry: core k times g / rms_k, g the
    geometric mean of the rms (the scales multiply to 1). TT-SVD leaves the first cores orthonormal
    (entries ~ 1/√(v d r)) and the norm in the last; Adam's steps are absolute per entry, so after
    balancing its learning rate means the same relative change for every core."""
    rms = [float(c.detach().pow(2).mean().sqrt()) for c in cores]
    if min(rms) == 0.0:
        return cores
    mean = math.exp(sum(math.log(r) for r in rms) / len(rms))
    return [c * (mean / r) for c, r in zip(cores, rms)]


def tt_matrix_to_dense(cores: list[Tensor]) -> Tensor:
    """Contract cores G_k (r_{k-1}, v_k, d_k, r_k) into the (Πv × Πd) matrix."""
    x = cores[0].new_ones(1, 1, 1)  # (rows so far, cols so far, rank)
    for g in cores:
        r0, v, d, r1 = g.shape
        x = torch.einsum("abr,rvds->avbds", x, g).reshape(x.shape[0] * v, x.shape[1] * d, r1)
    return x[..., 0]


def tt2_weighted_als(cores: list[Tensor], matrix: Tensor, row_weights: Tensor, sweeps: int = 20) -> list[Tensor]:
    """Two TT-matrix cores refitted to minimise Σ_p f_p ‖W_p − TT_p‖² (row p = i_1 v_2 + i_2),
    starting from `cores`. Alternating least squares: with G_2 fixed, the slices G_1[i_1] solve
    (Σ_{i_2} f_{i_1 i_2} G_2[i_2] G_2[i_2]ᵀ) X = Σ_{i_2} f_{i_1 i_2} G_2[i_2] W_{i_1 i_2}ᵀ, and alike
    for G_2; each half-sweep lowers the weighted error. Weights ≥ 0, one per row."""
    if len(cores) != 2:
        raise ShapeError(f"frequency-weighted TT cores are fitted for 2 cores, got {len(cores)}")
    (_, v1, d1, r), (_, v2, d2, _) = cores[0].shape, cores[1].shape
    if tuple(matrix.shape) != (v1 * v2, d1 * d2) or tuple(row_weights.shape) != (v1 * v2,):
        raise ShapeError(
            f"a {tuple(matrix.shape)} matrix with {tuple(row_weights.shape)} weights does not fit the cores"
        )
    if not bool((row_weights >= 0).all()) or not float(row_weights.sum()) > 0:
        raise ShapeError("row weights must be non-negative and not all zero")
    a = cores[0].detach().to(torch.float64)[0]  # (v1, d1, r)
    b = cores[1].detach().to(torch.float64)[..., 0]  # (r, v2, d2)
    f = row_weights.detach().to(torch.float64).reshape(v1, v2)
    # f_{i1 i2} W_{i1 i2}, laid out (v1 d1, v2 d2) for the right-hand sides
    fw = (f[:, :, None, None] * matrix.detach().to(torch.float64).reshape(v1, v2, d1, d2)).permute(0, 2, 1, 3)
    fw = fw.reshape(v1 * d1, v2 * d2)
    eye = torch.eye(r, dtype=torch.float64)

    def solve(gram: Tensor, rhs: Tensor) -> Tensor:  # gram (n, r, r), rhs (n, r, m); a tiny ridge for empty slices
        """By Cholesky, the grams being positive definite: torch 2.13's batched LU (MKL's threaded getrf inside
        torch's parallel_for) never returns once torch.set_num_threads has been called, as a fine-tune does."""
        ridged = gram + (1e-10 * gram.diagonal(dim1=1, dim2=2).mean(-1).clamp_min(1e-30))[:, None, None] * eye
        root, info = torch.linalg.cholesky_ex(ridged)
        out = torch.cholesky_solve(rhs, root)
        for i in info.nonzero().flatten().tolist():  # not positive definite in floating point: LU, one at a time
            out[i] = torch.linalg.solve(ridged[i], rhs[i])
        return out

    for _ in range(sweeps):
        gram = torch.einsum("ik,kpq->ipq", f, torch.einsum("pkb,qkb->kpq", b, b))  # (v1, r, r)
        rhs = (fw @ b.permute(1, 2, 0).reshape(v2 * d2, r)).reshape(v1, d1, r)
        a = solve(gram, rhs.transpose(1, 2)).transpose(1, 2)  # (v1, d1, r)
        gram = torch.einsum("ik,ipq->kpq", f, torch.einsum("iap,iaq->ipq", a, a))  # (v2, r, r)
        rhs = (a.reshape(v1 * d1, r).T @ fw).reshape(r, v2, d2).permute(1, 0, 2)  # (v2, r, d2)
        b = solve(gram, rhs).permute(1, 0, 2)  # (r, v2, d2)
    return [a[None].to(cores[0].dtype).contiguous(), b[..., None].to(cores[1].dtype).contiguous()]


def tt_refit_under_metric(
    cores: list[Tensor], matrix: Tensor, row_weights: Tensor, metric: Tensor, steps: int = 300, lr: float = 3e-3
) -> list[Tensor]:
    """Cores refitted by Adam (full batch, `steps` steps) to minimise Σ_p f_p δ_pᵀ M δ_p / Σ_p f_p,
    δ_p = TT_p − W_p, from `cores` (best balanced): rows weighted by f, columns under the PSD metric
    M (D × D, D ≤ the padded width; padded columns weigh nothing). No closed form: M couples the
    columns that the cores split. The start is returned if the refit ends no better."""
    dim = metric.shape[0]
    if tuple(metric.shape) != (dim, dim) or dim > matrix.shape[1] or tuple(row_weights.shape) != (len(matrix),):
        raise ShapeError(
            f"a {tuple(metric.shape)} metric and {tuple(row_weights.shape)} weights do not fit "
            f"a {tuple(matrix.shape)} matrix"
        )
    target = matrix.detach().float()[:, :dim]
    f = (row_weights.detach().float() / row_weights.sum().float())[:, None]
    m = metric.detach().float()
    params = [torch.nn.Parameter(c.detach().float().clone()) for c in cores]
    optimizer = torch.optim.Adam(params, lr=lr)

    def loss() -> Tensor:
        delta = tt_matrix_to_dense(params)[:, :dim] - target
        return (f * (delta @ m) * delta).sum()

    with torch.no_grad():
        start = float(loss())
    with torch.enable_grad():
        for _ in tqdm(range(steps), desc="TT refit under the sensitivity", leave=False):
            optimizer.zero_grad()
            loss().backward()
            optimizer.step()
    with torch.no_grad():
        end = float(loss())
    return [p.detach().to(c.dtype) for p, c in zip(params, cores)] if end < start else cores
