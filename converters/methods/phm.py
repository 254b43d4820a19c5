"""PHM / Kronecker sums (R2D2, ICLR 2020 submission, §2.2): the config, the build of linear layers (nn.Linear and
Hugging Face's Conv1D), the budget rule, and the registration. Fits: plain (the nearest Kronecker
sum, Van Loan–Pitsianis); aware (refitted to the layer's output error on calibration inputs);
fisher (aware, each layer's output weighted by its sensitivity, as the low-rank fisher kind)."""

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from compressor.budget import MeasuredCost
from compressor.dense import dense_weight
from compressor.errors import ShapeError
from compressor.phm import check_block_count, check_block_size, check_terms, kron_sum_factors
from compressor.phm_fit import kron_sum_metric_error, output_metrics
from compressor.phm_linear import PHMLinear
from converters.calibration import Calibration
from converters.methods.fit import check_fit, fit_metric, fit_option, needs_data, needs_sensitivity
from converters.registry import (
    BudgetRule,
    Context,
    Method,
    Option,
    Skip,
    config_from_options,
    field_options,
    option_field,
    register,
)

__all__ = ["PHMConfig"]


@dataclass(frozen=True)
class PHMConfig:
    """Each linear layer W (K×D) as Σ_{i=1}^{terms} A_i ⊗ S_i, A_i n×n and S_i (K/n)×(D/n): n must
    divide K and D; `terms` from 1 to n² (None: n, R2D2's choice; n² is exact). Fitted `plain` (the
    nearest Kronecker sum), `aware` or `fisher` (both refitted on calibration inputs)."""

    method: ClassVar[str] = "phm"
    n: int = option_field(4, Option("--n", "the block size n, dividing both dimensions of every layer", int, many=True))
    terms: int | None = option_field(
        None, Option("--terms", "Kronecker terms, 1 to n²", int, many=True, default="n; n² is exact")
    )
    fit: str = option_field(
        "fisher",
        fit_option("refitted to each layer's output error on calibration inputs", "the nearest Kronecker sum"),
    )

    def __post_init__(self):
        check_block_count(self.n)
        if self.terms is None:
            object.__setattr__(self, "terms", self.n)
        check_terms(self.terms, self.n)
        check_fit(self.fit, "PHM")

    def label(self) -> str:
        return f"phm-n{self.n}-t{self.terms}-{self.fit}"


def _check(name: str, module: nn.Module, cfg: PHMConfig) -> None:
    rows, cols = dense_weight(module).shape
    try:
        check_block_size(rows, cols, cfg.n)
    except ShapeError as e:
        raise ShapeError(f"{name}: {e}") from None


def _build(module: nn.Module, cfg: PHMConfig, ctx: Context) -> nn.Module | Skip:
    rows, cols = dense_weight(module).shape
    n, terms = cfg.n, cfg.terms
    if terms * (n * n + rows * cols // (n * n)) >= rows * cols:
        return Skip(
            f"{terms} Kronecker terms at n = {n} would not save parameters: "
            f"{terms}·({n}² + {rows}·{cols}/{n}²) ≥ {rows}·{cols}"
        )
    if not needs_data(cfg.fit):
        return PHMLinear.from_linear(module, n, terms)
    calib = ctx.require_calibration(f"the {cfg.fit} PHM fit")
    sensitivity = calib.sensitivity(ctx.name) if needs_sensitivity(cfg.fit) else None
    return PHMLinear.from_linear(module, n, terms, calib.gram(ctx.name), sensitivity)


def _sizes(module: nn.Module, cfg: PHMConfig) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(the numbers of terms t a budget offers: up to R(W)'s rank, while they save parameters; their
    parameters t·(n² + KD/n²); the dense parameters KD). Terms are coarse by nature: one costs
    1/n² of the dense layer and more (a sixteenth at n = 4), so a budget is spent to within one term."""
    rows, cols = dense_weight(module).shape
    n, dense = cfg.n, rows * cols
    per_term = n * n + dense // (n * n)
    most = min(n * n, dense // (n * n), (dense - 1) // per_term)  # R(W)'s rank, and saving parameters
    sizes = tuple(range(1, most + 1))
    return sizes, tuple(t * per_term for t in sizes), dense


def _bounds(module: nn.Module, cfg: PHMConfig) -> tuple[int, int]:
    """(the parameters at one term, or dense when no number of terms saves; the dense parameters)."""
    _, params, dense = _sizes(module, cfg)
    return (params[0] if params else dense), dense


def _layer_cost(name: str, module: nn.Module, cfg: PHMConfig, calib: Calibration) -> MeasuredCost:
    """The layer's parameters t·(n² + KD/n²) and estimated loss at every number of terms t that
    saves parameters, in the metric its fit under `cfg` minimises. plain: the tail Σ_{j>t} σ_j² of
    R(W)'s spectrum, exact (the plain fit is the truncated SVD of R(W)). aware and fisher: no closed
    form, so the t-term nearest Kronecker sum's error under the fit's own metric ‖Lᵀ (W − H) S‖²
    (kron_sum_metric_error: the output error, and with fisher the K-FAC loss estimate of the
    low-rank fisher fit, in the same units) — the refit starts from that sum and never raises it,
    so the estimate is an upper bound of the loss of the layer built; one metric product per t,
    no refit (seconds for a model, where refitting every t would take minutes a layer)."""
    w = dense_weight(module).detach().to(torch.float64)
    rows, cols = w.shape
    n, (sizes, params, dense) = cfg.n, _sizes(module, cfg)
    most = len(sizes)
    factors = kron_sum_factors(w, n, max(most, 1))
    if not needs_data(cfg.fit):
        energy = factors.spectrum.pow(2)
        losses = tuple(float(energy[t:].sum()) for t in sizes)
        return MeasuredCost(name, sizes, params, losses, float(energy.sum()), dense)
    sensitivity = calib.sensitivity(name) if needs_sensitivity(cfg.fit) else None
    gx, gy = output_metrics(calib.gram(name), sensitivity, rows, cols)
    a, s = factors.a, factors.s
    losses = tuple(kron_sum_metric_error(a[:t], s[:t], w, gx, gy) for t in sizes)
    return MeasuredCost(name, sizes, params, losses, kron_sum_metric_error(a[:0], s[:0], w, gx, gy), dense)


register(
    Method(
        config=PHMConfig,
        accepts=(nn.Linear, Conv1D),
        build=_build,
        compact=(PHMLinear,),
        options=field_options(PHMConfig),
        from_options=config_from_options(PHMConfig),
        check=_check,
        needs_calibration=lambda cfg: needs_data(cfg.fit),
        needs_sensitivity=lambda cfg: needs_sensitivity(cfg.fit),
        budget=BudgetRule(
            cost=_layer_cost,
            configure=lambda module, cfg: cfg,
            metric=fit_metric,
            bounds=_bounds,
            resize=lambda cfg, terms: replace(cfg, terms=terms),
            size="terms",
            sets=("terms",),
        ),
    )
)
