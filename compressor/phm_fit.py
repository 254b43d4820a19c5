"""A Kronecker sum H = Σ_i A_i ⊗ S_i fitted to data: minimise f(H) = tr((W − H) G_x (W − H)ᵀ G_y) =
‖Lᵀ (W − H) S‖_F², with G_x = S Sᵀ = XᵀX + λI the layer's input Gram (its output error on the
calibration inputs X) and G_y = L Lᵀ = F + μI its output sensitivity (the K-FAC loss estimate of the
low-rank `fisher` kind; G_y = I for the `aware` kind). Same damping as compressor.lowrank.

Alternating least squares from the Van Loan–Pitsianis start. f is quadratic in the A_i with the S_i
fixed and in the S_i with the A_i fixed, so each half-step is a linear least-squares problem:
- A-step, exact: normal equations in the t·n² entries of the A_i (a t·n² square system).
- S-step: normal equations in the t·KD/n² entries of the S_i, Σ_{a,a'} G_y[a,a'] Ŝ R_{a a'} = B
  (Ŝ = [S_1 … S_t], (K/n) × (t·D/n)). Without G_y it is Ŝ N = B with a small N (t·D/n square):
  solved exactly. With G_y it couples all K/n·t·D/n unknowns (≈150,000 in a MiniLM FFN layer),
  too many for a direct solve, so conjugate gradients do it, preconditioned by that exact solve
  with G_y's mean diagonal block; every CG step lowers f, so the sweeps still never raise it.
ALS rather than a gradient refit (as TT's fisher kind uses): each half-step lands on (or, under
G_y, heads straight for) the minimum along its factor, the aware kind's S-step is closed form, and
there is no learning rate to tune; tens of sweeps instead of hundreds of Adam steps."""

import torch
from torch import Tensor

from compressor.errors import ShapeError
from compressor.lowrank import SENSITIVITY_DAMP, cholesky_whitener
from compressor.phm import balance_terms, kron_sum_to_dense

__all__ = ["kron_sum_refit", "kron_sum_metric_error", "output_metrics"]

RIDGE = 1e-10  # normal equations are solved with this ridge (× mean diagonal, grown until they factor)


def _damped(metric: Tensor, damp: float) -> Tensor:
    """M + λI in float64, λ as cholesky_whitener grows it from damp·mean(diag M)."""
    lam = cholesky_whitener(metric, damp)[1]
    m = metric.detach().to(torch.float64)
    return m + lam * torch.eye(len(m), dtype=torch.float64)


def output_metrics(gram: Tensor, sensitivity: Tensor | None, rows: int, cols: int) -> tuple[Tensor, Tensor | None]:
    """(G_x, G_y) = (XᵀX + λI, F + μI), damped as the low-rank kinds do; G_y is None without F."""
    if gram.shape != (cols, cols):
        raise ShapeError(f"a Gram matrix {tuple(gram.shape)} does not match a layer with {cols} inputs")
    if sensitivity is not None and sensitivity.shape != (rows, rows):
        raise ShapeError(f"a sensitivity matrix {tuple(sensitivity.shape)} does not match a layer output of {rows}")
    return _damped(gram, 1e-6), None if sensitivity is None else _damped(sensitivity, SENSITIVITY_DAMP)


def _apply(gx: Tensor, gy: Tensor | None, m: Tensor) -> Tensor:
    """G_y M G_x."""
    m = m @ gx
    return m if gy is None else gy @ m


def kron_sum_metric_error(a: Tensor, s: Tensor, weight: Tensor, gx: Tensor, gy: Tensor | None) -> float:
    """f = tr(Δ G_x Δᵀ G_y), Δ = W − Σ_i a[i] ⊗ s[i] (G_y = I when None)."""
    delta = weight.to(torch.float64) - kron_sum_to_dense(a.to(torch.float64), s.to(torch.float64))
    return float((_apply(gx, gy, delta) * delta).sum())


def _a_step(s: Tensor, target: Tensor, gx: Tensor, gy: Tensor | None) -> Tensor:
    """The A_i minimising f for fixed S_i: Σ_{j,c,d} ⟨S_i, G_y[a,c] S_j G_x[d,b]⟩ A_j[c,d] = ⟨S_i, T_{a,b}⟩,
    T = G_y W G_x in (n, K/n, n, D/n) blocks."""
    t, p, q = s.shape
    n = target.shape[0]
    sg = torch.einsum("jrs,dsbu->jdbru", s, gx.reshape(n, q, n, q))  # S_j G_x[d,b]: (t, n, n, K/n, D/n)
    if gy is None:  # G_y[a,c] = δ_ac I
        inner = torch.einsum("iru,jdbru->ibjd", s, sg)
        normal = torch.einsum("ibjd,ac->iabjcd", inner, torch.eye(n, dtype=s.dtype))
    else:
        gs = torch.einsum("arcv,iru->iacvu", gy.reshape(n, p, n, p), s)  # G_y[a,c]ᵀ S_i: (t, n, n, K/n, D/n)
        normal = torch.einsum("iacvu,jdbvu->iabjcd", gs, sg)
    rhs = torch.einsum("iru,arbu->iab", s, target)
    root = cholesky_whitener(normal.reshape(t * n * n, t * n * n), RIDGE)[0]
    return torch.cholesky_solve(rhs.reshape(-1, 1), root).reshape(t, n, n)


def _s_step(a: Tensor, s: Tensor, target: Tensor, gx: Tensor, gy: Tensor | None, cg_steps: int) -> Tensor:
    """The S_i for fixed A_i: the normal equations 𝒜(S) = B, 𝒜(S)_i = Σ_{a,b} A_i[a,b] (G_y H(S) G_x)_{a,b},
    by preconditioned CG from the current S (exact in one step without G_y)."""
    t, n, _ = a.shape
    p, q = s.shape[1:]
    gx4 = gx.reshape(n, q, n, q)

    def operator(x: Tensor) -> Tensor:  # (t, p, q) → (t, p, q)
        image = _apply(gx, gy, kron_sum_to_dense(a, x)).reshape(n, p, n, q)
        return torch.einsum("iab,arbu->iru", a, image)

    # the preconditioner: 𝒜 with G_y replaced by I ⊗ Ḡ (Ḡ its mean diagonal block), Ŝ ↦ Ḡ Ŝ N
    mix = torch.einsum("iab,bsdu,jad->isju", a, gx4, a).reshape(t * q, t * q)  # N
    mean_block = torch.eye(p, dtype=a.dtype) if gy is None else gy.reshape(n, p, n, p).diagonal(dim1=0, dim2=2).mean(-1)
    mean_root, mix_root = cholesky_whitener(mean_block, RIDGE)[0], cholesky_whitener(mix, RIDGE)[0]

    def precondition(r: Tensor) -> Tensor:
        flat = r.permute(1, 0, 2).reshape(p, t * q)  # Ŝ layout: row r, column (i, u)
        flat = torch.cholesky_solve(flat, mean_root)
        flat = torch.cholesky_solve(flat.T, mix_root).T  # N is symmetric
        return flat.reshape(p, t, q).permute(1, 0, 2)

    rhs = torch.einsum("iab,arbu->iru", a, target)
    x, r = s, rhs - operator(s)
    z = precondition(r)
    d, rz = z, (r * z).sum()
    for step in range(cg_steps):
        image = operator(d)
        curvature = (d * image).sum()
        if not curvature > 0:
            break
        alpha = rz / curvature
        x, r = x + alpha * d, r - alpha * image
        if step + 1 == cg_steps:
            break
        z = precondition(r)
        rz, rz_old = (r * z).sum(), rz
        d = z + (rz / rz_old) * d
    return x


def kron_sum_refit(
    a: Tensor,
    s: Tensor,
    weight: Tensor,
    gram: Tensor,
    sensitivity: Tensor | None = None,
    sweeps: int = 20,
    cg_steps: int = 8,
    tol: float = 1e-4,
) -> tuple[Tensor, Tensor]:
    """A Kronecker sum (a: (t, n, n), s: (t, K/n, D/n)) refitted to a weight W (K×D) by ALS under
    the output error on the calibration inputs (gram = XᵀX), and the output sensitivity F too when
    given: at most `sweeps` sweeps, stopping when a sweep lowers f by less than `tol` relative.
    Returned balanced, in the dtype of `a`; never worse than the start under f."""
    rows, cols = weight.shape
    gx, gy = output_metrics(gram, sensitivity, rows, cols)
    t, n, _ = a.shape
    p, q = rows // n, cols // n
    if s.shape != (t, p, q):
        raise ShapeError(f"Kronecker factors {tuple(a.shape)} and {tuple(s.shape)} do not fit a {rows}×{cols} weight")
    w = weight.detach().to(torch.float64)
    target = _apply(gx, gy, w).reshape(n, p, n, q)  # G_y W G_x in blocks
    steps = 1 if gy is None else cg_steps  # without G_y one preconditioned step is the exact solve
    fit_a, fit_s = a.detach().to(torch.float64), s.detach().to(torch.float64)
    error = kron_sum_metric_error(fit_a, fit_s, w, gx, gy)
    for _ in range(sweeps):
        new_a = _a_step(fit_s, target, gx, gy)
        new_a, new_s = balance_terms(new_a, _s_step(new_a, fit_s, target, gx, gy, steps))
        new_error = kron_sum_metric_error(new_a, new_s, w, gx, gy)
        if new_error < error:
            fit_a, fit_s = new_a, new_s
        if not new_error < (1 - tol) * error:
            break
        error = new_error
    return fit_a.to(a.dtype), fit_s.to(s.dtype)
