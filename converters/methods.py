"""Registry from a method config type to the handler that builds the compact module.

Each handler declares the module types it accepts, so a plan is checked against the model
before any decomposition runs; anything else is an "unsupported module" PlanError. A handler
returns the compact module, or a Skip saying why the module stays dense."""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from compressor.errors import PlanError
from compressor.head_tail import HeadTailEmbedding
from compressor.lowrank_embedding import LowRankEmbedding
from compressor.lowrank_linear import LowRankLinear
from compressor.tt_embedding import TTEmbedding
from converters.calibration import Calibration
from converters.plan import LowRankConfig, TTConfig

__all__ = ["Handler", "HANDLERS", "Skip", "Context", "handler_for", "COMPACT_MODULES", "head_tokens"]


@dataclass(frozen=True)
class Skip:
    reason: str


@dataclass(frozen=True)
class Context:
    name: str
    calibration: Calibration | None

    def require_calibration(self, what: str) -> Calibration:
        if self.calibration is None:
            raise PlanError(f"{self.name}: {what} needs calibration statistics; pass calibration text (--calib)")
        return self.calibration


@dataclass(frozen=True)
class Handler:
    accepts: tuple[type[nn.Module], ...]
    build: Callable[[nn.Module, object, Context], nn.Module | Skip]
    needs_calibration: Callable[[object], bool]


HANDLERS: dict[type, Handler] = {}

# Compact module classes a checkpoint may rebuild, by class name (the loading allowlist).
COMPACT_MODULES: dict[str, type[nn.Module]] = {
    cls.__name__: cls for cls in (TTEmbedding, LowRankLinear, LowRankEmbedding, HeadTailEmbedding)
}


def registers(config_type: type, accepts: tuple[type[nn.Module], ...], needs_calibration=lambda cfg: False):
    def wrap(build):
        HANDLERS[config_type] = Handler(accepts, build, needs_calibration)
        return build

    return wrap


def handler_for(name: str, module: nn.Module, config) -> Handler:
    handler = HANDLERS.get(type(config))
    if handler is None:
        raise PlanError(f"no handler is registered for {type(config).__name__}")
    if not isinstance(module, handler.accepts):
        kinds = ", ".join(t.__name__ for t in handler.accepts)
        raise PlanError(
            f"unsupported module: {config.method} applies to {kinds}, but {name!r} is a {type(module).__name__}"
        )
    return handler


def head_tokens(calibration: Calibration, k: int) -> Tensor:
    """The k most frequent token ids in the calibration text, special tokens always among them."""
    counts = calibration.counts.clone().to(torch.float64)
    counts[list(calibration.special_ids)] = float("inf")
    return torch.argsort(counts, descending=True, stable=True)[:k]


def _with_dense_head(embedding: nn.Embedding, k: int, ctx: Context, build_tail) -> nn.Module:
    if k >= embedding.num_embeddings:
        raise PlanError(
            f"{ctx.name}: a dense head of {k} rows leaves no tail of a {embedding.num_embeddings}-row table"
        )
    calib = ctx.require_calibration("a dense head")
    return HeadTailEmbedding.from_embedding(embedding, head_tokens(calib, k), build_tail)


TT_UNSEEN_WEIGHT = 0.03  # a weighted TT row's weight is its calibration count plus this


@registers(TTConfig, accepts=(nn.Embedding,), needs_calibration=lambda cfg: cfg.dense_head > 0 or cfg.weighted)
def _tt_embedding(module: nn.Embedding, cfg: TTConfig, ctx: Context) -> nn.Module:
    calib = ctx.require_calibration("a frequency-weighted TT") if cfg.weighted else None
    sensitivity = calib.sensitivity(ctx.name) if cfg.sensitive else None

    def build(weight, ids):
        freq = None if calib is None else calib.counts[ids].to(torch.float64) + TT_UNSEEN_WEIGHT
        return TTEmbedding.from_weight(weight, cfg.rank, cfg.rel_eps, cfg.num_cores, cfg.order, freq, sensitivity)

    if cfg.dense_head:
        return _with_dense_head(module, cfg.dense_head, ctx, build)
    return build(module.weight, torch.arange(module.num_embeddings))


def lowrank_linear_rank(cfg: LowRankConfig, out_features: int, in_features: int) -> int:
    """The configured rank, or the one keeping the fraction cfg.keep of K·D parameters."""
    if cfg.rank is not None:
        return cfg.rank
    return int(cfg.keep * out_features * in_features // (out_features + in_features))


def lowrank_tail_rank(cfg: LowRankConfig, rows: int, dim: int) -> int:
    """The configured rank, or the tail rank that keeps cfg.keep of the whole table's V·D
    parameters once the dense head (K·D) is paid: (keep·V·D − K·D) / (V − K + D)."""
    if cfg.rank is not None:
        return cfg.rank
    k = cfg.dense_head
    return int((cfg.keep * rows * dim - k * dim) // (rows - k + dim))


@registers(
    LowRankConfig,
    accepts=(nn.Linear, nn.Embedding),
    needs_calibration=lambda cfg: cfg.whiten or cfg.weighted or cfg.dense_head > 0,
)
def _lowrank(module: nn.Module, cfg: LowRankConfig, ctx: Context) -> nn.Module | Skip:
    if isinstance(module, nn.Linear):
        k, d = module.out_features, module.in_features
        rank = lowrank_linear_rank(cfg, k, d)
        if rank < 1 or rank * (k + d) >= k * d:
            return Skip(f"rank {rank} would not save parameters: {rank}·({k}+{d}) ≥ {k}·{d}")
        if not cfg.whiten:
            return LowRankLinear.from_linear(module, rank)
        calib = ctx.require_calibration("activation-aware low-rank")
        if calib.tokens < rank:
            raise PlanError(
                f"{ctx.name}: the calibration text has {calib.tokens} tokens; activation-aware rank {rank} "
                f"needs at least {rank} (a few times {d}, the layer's inputs, is better)"
            )
        sensitivity = calib.sensitivity(ctx.name) if cfg.sensitive else None
        return LowRankLinear.from_linear(module, rank, calib.gram(ctx.name), sensitivity)

    rows, dim = module.weight.shape
    rank = lowrank_tail_rank(cfg, rows, dim)
    if rank < 1:
        return Skip(f"a dense head of {cfg.dense_head} rows leaves no parameters for the tail at keep={cfg.keep}")
    calib = ctx.require_calibration("frequency weighting") if cfg.weighted else None
    sensitivity = calib.sensitivity(ctx.name) if cfg.sensitive else None

    def build(weight, ids):
        freq = None if calib is None else calib.counts[ids].to(torch.float64) + 1.0  # +1: unseen tokens still count
        return LowRankEmbedding.from_weight(weight, rank, freq, sensitivity)

    if cfg.dense_head:
        return _with_dense_head(module, cfg.dense_head, ctx, build)
    if rank * (rows + dim) >= rows * dim:
        return Skip(f"rank {rank} would not save parameters: {rank}·({rows}+{dim}) ≥ {rows}·{dim}")
    return build(module.weight, torch.arange(rows))
