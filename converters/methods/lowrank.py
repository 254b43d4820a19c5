"""Low-rank factors (truncated SVD; the activation-aware fit of SVD-LLM, Wang et al. 2024): the config, the build
of linear layers and embeddings, the budget rule, and the registration. Fits: plain SVD; aware (activation-aware
linear layers, frequency-weighted embeddings); fisher (aware, each layer's output weighted by its sensitivity)."""

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from compressor.budget import LayerCost
from compressor.dense import LINEAR_TYPES, dense_weight
from compressor.errors import PlanError
from compressor.head_tail import HeadTailEmbedding
from compressor.lowrank import SENSITIVITY_DAMP, cholesky_whitener
from compressor.lowrank_embedding import LowRankEmbedding
from compressor.lowrank_linear import LowRankLinear
from compressor.ranks import check_rank
from converters.calibration import Calibration
from converters.methods.dense_head import DENSE_HEAD_OPTION, check_dense_head, check_head_fits, with_dense_head
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

__all__ = ["LowRankConfig"]


@dataclass(frozen=True)
class LowRankConfig:
    """Low-rank factors W ≈ up · down at `rank`, or (no rank) at the rank that keeps the fraction `keep`
    of the module's parameters; embeddings may keep an exact `dense_head`. Fitted `plain` (SVD),
    `aware` (activation-aware linear layers, frequency-weighted embeddings) or `fisher` (aware, and
    each layer's output weighted by its sensitivity)."""

    method: ClassVar[str] = "lowrank"
    rank: int | None = option_field(None, Option("--rank", "the rank", int, many=True, default="from --keep"))
    keep: float | None = option_field(
        0.5, Option("--keep", "without --rank: keep this fraction of each module's parameters", float)
    )
    dense_head: int = option_field(0, DENSE_HEAD_OPTION)
    fit: str = option_field(
        "fisher",
        fit_option(
            "activation-aware for linear layers, frequency-weighted for embeddings", "SVD of the weight or table"
        ),
    )

    @property
    def whiten(self) -> bool:
        """A linear layer's factors fitted in its input Gram's metric."""
        return needs_data(self.fit)

    @property
    def weighted(self) -> bool:
        """A table's rows weighted by their calibration frequency."""
        return needs_data(self.fit)

    @property
    def sensitive(self) -> bool:
        return needs_sensitivity(self.fit)

    def __post_init__(self):
        check_dense_head(self.dense_head)
        check_fit(self.fit, "low-rank")
        if self.rank is None and self.keep is None:
            raise PlanError("a low-rank plan needs a rank or a fraction of parameters to keep; got neither")
        if self.rank is not None:
            check_rank(self.rank)
            object.__setattr__(self, "keep", None)  # a rank is the size; keep is what sizes it otherwise
        if self.keep is not None and (isinstance(self.keep, bool) or not 0 < self.keep < 1):
            raise PlanError(f"the fraction of parameters to keep must lie in (0, 1), got {self.keep!r}")

    def label(self) -> str:
        size = f"r{self.rank}" if self.rank is not None else f"keep{self.keep:g}"
        head = [f"head{self.dense_head}"] if self.dense_head else []
        return "-".join(["lowrank", *head, size, self.fit])


def _weight(module: nn.Module):
    """The table of an embedding, W (out × in) of a linear layer (nn.Linear or Conv1D)."""
    return module.weight if isinstance(module, nn.Embedding) else dense_weight(module)


def _footprint(module: nn.Module, cfg: LowRankConfig) -> tuple[int, int, int]:
    """(parameters per rank, dense parameters, fixed parameters): a linear K×D layer costs r(K+D)
    against KD; a V×D table with a dense head of K rows costs KD + r(V−K+D) against VD."""
    rows, cols = _weight(module).shape
    head = cfg.dense_head if isinstance(module, nn.Embedding) else 0
    return rows - head + cols, rows * cols, head * cols


def _rank(module: nn.Module, cfg: LowRankConfig) -> int:
    """The configured rank, or the one keeping the fraction cfg.keep of the dense parameters."""
    if cfg.rank is not None:
        return cfg.rank
    per_rank, dense, fixed = _footprint(module, cfg)
    return int((cfg.keep * dense - fixed) // per_rank)


def _build(module: nn.Module, cfg: LowRankConfig, ctx: Context) -> nn.Module | Skip:
    rank = _rank(module, cfg)
    per_rank, dense, fixed = _footprint(module, cfg)
    rows, cols = _weight(module).shape
    if not isinstance(module, nn.Embedding):
        if rank < 1 or rank * per_rank >= dense:
            return Skip(f"rank {rank} would not save parameters: {rank}·({rows}+{cols}) ≥ {rows}·{cols}")
        if not cfg.whiten:
            return LowRankLinear.from_linear(module, rank)
        calib = ctx.require_calibration("activation-aware low-rank")
        if calib.tokens < rank:
            raise PlanError(
                f"{ctx.name}: the calibration text has {calib.tokens} tokens; activation-aware rank {rank} "
                f"needs at least {rank} (a few times {cols}, the layer's inputs, is better)"
            )
        sensitivity = calib.sensitivity(ctx.name) if cfg.sensitive else None
        return LowRankLinear.from_linear(module, rank, calib.gram(ctx.name), sensitivity)

    if rank < 1:
        return Skip(f"a dense head of {cfg.dense_head} rows leaves no parameters for the tail at keep={cfg.keep}")
    calib = ctx.require_calibration("frequency weighting") if cfg.weighted else None
    sensitivity = calib.sensitivity(ctx.name) if cfg.sensitive else None

    def build(weight, ids):
        freq = None if calib is None else calib.counts[ids].to(torch.float64) + 1.0  # +1: unseen tokens still count
        return LowRankEmbedding.from_weight(weight, rank, freq, sensitivity)

    if cfg.dense_head:
        return with_dense_head(module, cfg.dense_head, ctx, build)
    if rank * per_rank >= dense:
        return Skip(f"rank {rank} would not save parameters: {rank}·({rows}+{cols}) ≥ {rows}·{cols}")
    return build(module.weight, torch.arange(rows))


def _layer_cost(name: str, module: nn.Module, cfg: LowRankConfig, calib: Calibration) -> LayerCost:
    """The layer's cost per rank and the singular values its truncation under `cfg` will use:
    of W S (S the input whitener) for linear layers, of the frequency-weighted tail rows for
    embeddings; mapped by the output sensitivity's root with the fisher fit."""
    w = _weight(module).detach().to(torch.float64)
    out = cholesky_whitener(calib.sensitivity(name), SENSITIVITY_DAMP)[0] if cfg.sensitive else None
    per_rank, dense, fixed = _footprint(module, cfg)
    if not isinstance(module, nn.Embedding):
        if cfg.whiten:
            w = w @ cholesky_whitener(calib.gram(name))[0]
        if out is not None:
            w = out.T @ w
        return LayerCost(name, torch.linalg.svdvals(w), per_rank=per_rank, dense=dense)
    tail = torch.ones(w.shape[0], dtype=torch.bool)
    if cfg.dense_head:
        tail[calib.head_tokens(cfg.dense_head)] = False
    weighted = w[tail]
    if cfg.weighted:
        weighted = weighted * (calib.counts[tail].to(torch.float64) + 1.0).sqrt()[:, None]
    spectrum = torch.linalg.svdvals(weighted if out is None else weighted @ out)
    return LayerCost(name, spectrum, per_rank=per_rank, dense=dense, fixed=fixed)


def _bounds(module: nn.Module, cfg: LowRankConfig) -> tuple[int, int]:
    """(the parameters at the budget's smallest rank, or dense when no rank saves; the dense
    parameters): _layer_cost's points, from shapes alone (no spectrum)."""
    per_rank, dense, fixed = _footprint(module, cfg)
    rows, cols = _weight(module).shape
    head = cfg.dense_head if isinstance(module, nn.Embedding) else 0
    shape = LayerCost("", torch.zeros(max(0, min(rows - head, cols))), per_rank=per_rank, dense=dense, fixed=fixed)
    return shape.points()[0].params, dense


def _for_budget(module: nn.Module, cfg: LowRankConfig) -> LowRankConfig:
    """The config a budget gives one module: a rank (set later), no keep; the dense head on embeddings only."""
    head = cfg.dense_head if isinstance(module, nn.Embedding) else 0
    return LowRankConfig(rank=1, dense_head=head, fit=cfg.fit)


register(
    Method(
        config=LowRankConfig,
        accepts=(*LINEAR_TYPES, nn.Embedding),
        build=_build,
        compact=(LowRankLinear, LowRankEmbedding, HeadTailEmbedding),
        options=field_options(LowRankConfig),
        from_options=config_from_options(LowRankConfig),
        check=lambda name, module, cfg: check_head_fits(name, module, cfg.dense_head),
        needs_calibration=lambda cfg: needs_data(cfg.fit) or cfg.dense_head > 0,
        needs_sensitivity=lambda cfg: needs_sensitivity(cfg.fit),
        budget=BudgetRule(
            cost=_layer_cost, configure=_for_budget, metric=fit_metric, bounds=_bounds, sets=("rank", "keep")
        ),
    )
)
