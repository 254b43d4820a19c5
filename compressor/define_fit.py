"""A DeFINE unit fitted to a trained table W (V × m) after training (DeFINE, Mehta et al. 2020, §3 and
appendix A.1).

The start is the best rank-n table E B: the truncated SVD of diag(√f) W L (f the row weights, L Lᵀ =
F + μI with F the output sensitivity; compressor.lowrank.weighted_row_factors), E and B balanced
(equal rms entry). The unit is set to compute e ↦ e B exactly: the last layer carries e and −e, the
reduce B and −B (GELU(x) − GELU(−x) = x), and every other output of every layer is a random feature
whose reduce row is zero. Then the unit is regressed on W's rows, minimising

    L = Σ_t f_t δ_tᵀ M δ_t / Σ_t f_t,   δ_t = unit(e_t) − w_t,   M = F + μI (I without F),

by Adam on batches of tokens drawn in proportion to f (an unbiased estimate of L), between two exact
refits of the reduce (R, b), by weighted least squares over every token (M, invertible, does not
change its minimiser). The start is kept if the fit ends no better. Last, each layer (and the
reduce) is stored balanced: divided by the scale that gives it the map's rms entry. On MiniLM's table (n = 64,
k = 1024, N = 3, aware weights) L/energy went 0.431 (the rank-64 start) → 0.257 (the first refit) →
0.224 (300 steps), where rank 107 (the unit's parameters) reaches 0.297 and rank 160 0.187."""

import copy
import math

import torch
from torch import Tensor, nn
from torch.nn import functional
from tqdm.auto import tqdm

from compressor.define import CHUNK, group_linear, mix
from compressor.errors import ShapeError
from compressor.lowrank import SENSITIVITY_DAMP, svd_factors, weighted_row_factors

__all__ = ["fit_define", "weighted_error", "FIT_STEPS", "FIT_BATCH", "FIT_LR"]

FIT_STEPS = 300
FIT_BATCH = 1024  # tokens per Adam step
FIT_LR = 3e-4  # 1e-3 ended worse on MiniLM's table (0.324 against 0.312 after 100 steps)
SAMPLE = 4096  # tokens whose layer inputs scale the random features
# A fine-tune's relative step in the HGT and the reduce, against the map's: a tenth, as the fine-tune
# steps a linear layer's factors against a table's (FinetuneConfig: linear_lr = lr / 10)
STEP = 0.1


def _metric(sensitivity: Tensor | None, dim: int) -> Tensor | None:
    """M = F + μI (μ = SENSITIVITY_DAMP · mean diag F), or None for the identity."""
    if sensitivity is None:
        return None
    if sensitivity.shape != (dim, dim):
        raise ShapeError(f"an output sensitivity must be ({dim}, {dim}), got {tuple(sensitivity.shape)}")
    damp = SENSITIVITY_DAMP * sensitivity.diagonal().mean().clamp_min(1e-30)
    return (sensitivity.to(torch.float64) + damp * torch.eye(dim, dtype=torch.float64)).float()


def _loss(out: Tensor, target: Tensor, metric: Tensor | None) -> Tensor:
    """δ_tᵀ M δ_t per row, δ = out − target: (N,)."""
    delta = out - target
    return ((delta if metric is None else delta @ metric) * delta).sum(-1)


def weighted_error(
    module: nn.Module, weight: Tensor, row_weights: Tensor | None = None, sensitivity: Tensor | None = None
) -> float:
    """Σ_t f_t δ_tᵀ M δ_t / Σ_t f_t over every token (f = 1 and M = I when not given; M = F + μI)."""
    f = torch.ones(len(weight)) if row_weights is None else row_weights.detach().float()
    with torch.no_grad():
        losses = _loss(module.to_dense(), weight.float(), _metric(sensitivity, weight.shape[1]))  # (V,)
    return float((f * losses).sum() / f.sum())


def _start_(module: nn.Module, weight: Tensor, f: Tensor | None, sensitivity: Tensor | None, generator) -> None:
    """The unit set to compute e ↦ e B from the rank-n fit E B (see the module's docstring)."""
    n = module.spec.n
    factors = svd_factors(weight, n) if f is None else weighted_row_factors(weight, f, n, sensitivity)
    scale = math.sqrt(float(factors.down.pow(2).mean().sqrt() / factors.up.pow(2).mean().sqrt().clamp_min(1e-30)))
    codes, basis = factors.up.float() * scale, factors.down.float() / scale  # balanced: equal rms entry
    p = torch.ones(len(weight)) if f is None else f.float()
    sample = codes[torch.multinomial(p, min(SAMPLE, len(weight)), replacement=True, generator=generator)]
    x = sample  # (S, n): each layer's weights are scaled to its inputs on these tokens
    with torch.no_grad():
        module.map.copy_(codes)
        module.scales.fill_(1.0)
        for layer, (w, bias) in enumerate(zip(module.weights, module.biases)):
            if layer > 0:
                x = mix(sample, x, w.shape[0])
            rms = x.pow(2).mean().sqrt().clamp_min(1e-30)
            w.copy_(torch.randn(w.shape, generator=generator) / (math.sqrt(w.shape[1]) * rms))  # random features
            bias.zero_()
            x = functional.gelu(group_linear(x, w))
        module.reduce.zero_()
        module.reduce_bias.zero_()
        last = module.weights[-1]  # (g, n/g + o_{N−1}/g, k/g); group j's input starts with e's chunk j
        groups, _, outputs = last.shape
        chunk = n // groups
        eye = torch.eye(chunk)
        last[:, :, : 2 * chunk] = 0
        last[:, :chunk, :chunk] = eye  # +e_j
        last[:, :chunk, chunk : 2 * chunk] = -eye  # −e_j
        for j in range(groups):
            block = basis[j * chunk : (j + 1) * chunk]  # B's rows for chunk j of e
            module.reduce[j * outputs : j * outputs + chunk] = block
            module.reduce[j * outputs + chunk : j * outputs + 2 * chunk] = -block


def _refit_reduce_(module: nn.Module, weight: Tensor, f: Tensor) -> None:
    """(R, b) minimising Σ_t f_t ‖h_t R + b − w_t‖², h_t = HGT(e_t): normal equations in float64
    (a tiny ridge for features that vanish on every token)."""
    k = module.spec.k
    gram = torch.zeros(k + 1, k + 1, dtype=torch.float64)
    rhs = torch.zeros(k + 1, weight.shape[1], dtype=torch.float64)
    with torch.no_grad():
        for codes, weights, rows in zip(module.map.split(CHUNK), f.split(CHUNK), weight.split(CHUNK)):
            h = module.expand(codes).double()
            h = torch.cat([h, h.new_ones(len(h), 1)], dim=1)  # (N, k + 1)
            fh = weights[:, None].double() * h
            gram += fh.T @ h
            rhs += fh.T @ rows.double()
        ridge = 1e-9 * gram.diagonal().mean().clamp_min(1e-30)
        solution = torch.linalg.solve(gram + ridge * torch.eye(k + 1, dtype=torch.float64), rhs)
        module.reduce.copy_(solution[:k])
        module.reduce_bias.copy_(solution[k])


def fit_define(
    module: nn.Module,
    weight: Tensor,
    row_weights: Tensor | None = None,
    sensitivity: Tensor | None = None,
    steps: int | None = None,
    batch: int = FIT_BATCH,
    lr: float = FIT_LR,
    seed: int = 0,
) -> nn.Module:
    """`module` (a DefineEmbedding) fitted in place to the (V, m) table `weight`: the rank-n start,
    the exact reduce, `steps` (default FIT_STEPS) Adam steps on `batch` tokens (at most V) drawn ∝ f
    at `lr` (decayed linearly to 0), the exact reduce again. `row_weights` f (one per token,
    positive), `sensitivity` F (m × m, with f); seeded."""
    steps = FIT_STEPS if steps is None else steps
    batch = min(batch, len(weight))
    weight = weight.detach()
    if row_weights is not None and (row_weights.shape != (len(weight),) or not bool((row_weights > 0).all())):
        raise ShapeError(f"row weights must be {len(weight)} positive numbers, got shape {tuple(row_weights.shape)}")
    if sensitivity is not None and row_weights is None:
        raise ShapeError("an output sensitivity comes with row weights (the fisher kind builds on the aware one)")
    generator = torch.Generator().manual_seed(seed)
    f = torch.ones(len(weight)) if row_weights is None else row_weights.detach().float()
    metric = _metric(sensitivity, weight.shape[1])
    _start_(module, weight, row_weights, sensitivity, generator)
    start = weighted_error(module, weight, f, sensitivity)
    kept = copy.deepcopy(module.state_dict())
    _refit_reduce_(module, weight, f)  # the random features' reduce rows, so that Adam starts from a fitted reduce
    target = weight.float()
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    with torch.enable_grad():
        for step in tqdm(range(steps), desc="DeFINE fit", leave=False):
            ids = torch.multinomial(f, batch, replacement=True, generator=generator)
            optimizer.param_groups[0]["lr"] = lr * (1 - step / steps)
            optimizer.zero_grad()
            _loss(module(ids), target[ids], metric).mean().backward()
            optimizer.step()
    _refit_reduce_(module, weight, f)
    if not weighted_error(module, weight, f, sensitivity) < start:
        module.load_state_dict(kept)
    _balance_(module)
    return module


def _balance_(module: nn.Module) -> None:
    """Each layer's (weight, bias) and the reduce's stored divided by s = rms(weight) · STEP / rms(map),
    s in the module's scales (the unit unchanged): one Adam rate then moves each of them STEP times
    as far, relatively, as the map's rows."""
    target = module.map.detach().pow(2).mean().sqrt() / STEP
    pairs = [*zip(module.weights, module.biases), (module.reduce, module.reduce_bias)]
    with torch.no_grad():
        for i, (weight, bias) in enumerate(pairs):
            scale = (weight.pow(2).mean().sqrt() * module.scales[i] / target).clamp_min(1e-30)
            weight.mul_(module.scales[i] / scale)
            bias.mul_(module.scales[i] / scale)
            module.scales[i] = scale
