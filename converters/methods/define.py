"""DeFINE (Mehta et al. 2020, §3): the config, the fit of a unit to a trained nn.Embedding, the export forms,
and the registration. Fits: plain (the unit regressed on the table's rows), aware (rows weighted
by calibration token frequencies), fisher (aware, under the embedding output's sensitivity).

Export forms (--define-export): compute (the V×n map and the HGT, as compressed), cache (the unit
evaluated for every token, shipped as a V×m table: a plain Gather), hybrid (the outputs of the K
most frequent calibration tokens cached, the unit kept for the rest)."""

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from compressor.define import hgt_schedule
from compressor.define_embedding import DefineEmbedding, DefineEmbeddingSpec
from compressor.define_hybrid import HybridEmbedding
from compressor.errors import CompressorError, ShapeError
from compressor.head_tail import HeadTailEmbedding
from converters.methods.dense_head import DENSE_HEAD_OPTION, check_dense_head, check_head_fits, with_dense_head
from converters.methods.fit import check_fit, fit_option, needs_data, needs_sensitivity
from converters.registry import (
    Context,
    ExportForms,
    Method,
    Option,
    Skip,
    config_from_options,
    field_options,
    given,
    option_field,
    register,
)

__all__ = ["DefineConfig", "DEFINE_FORMS", "HYBRID_HEAD"]

DEFINE_FORMS = ("compute", "cache", "hybrid")
HYBRID_HEAD = 2048  # tokens whose outputs a hybrid export caches, by default


@dataclass(frozen=True)
class DefineConfig:
    """A DeFINE unit: a V×n map, N group linear layers widening n to k (g_max groups first, halved at
    each next layer, at least 1), the mixer, and a reduce to the table's width; fitted to the trained
    table by `fit`; with `dense_head`, the K most frequent tokens keep exact rows and the unit holds the rest."""

    method: ClassVar[str] = "define"
    n: int = option_field(64, Option("--define-n", "the map's width n, below the table's", int, many=True))
    k: int = option_field(1024, Option("--define-k", "the widest layer's width k, at least 2n", int, many=True))
    layers: int = option_field(
        3, Option("--define-layers", "group linear layers N, widths spaced linearly from n to k", int, many=True)
    )
    max_groups: int = option_field(
        4, Option("--define-groups", "groups g_max of the first layer, halved at each next one", int)
    )
    fit: str = option_field(
        "fisher",
        fit_option("rows weighted by calibration token frequencies", "the unit regressed on the table's rows"),
    )
    dense_head: int = option_field(0, DENSE_HEAD_OPTION)

    def __post_init__(self):
        check_dense_head(self.dense_head)
        check_fit(self.fit, "DeFINE")
        hgt_schedule(self.n, self.k, self.layers, self.max_groups)

    def label(self) -> str:
        head = [f"head{self.dense_head}"] if self.dense_head else []
        return "-".join(["define", *head, f"n{self.n}-k{self.k}-l{self.layers}-g{self.max_groups}", self.fit])


def _check(name: str, module: nn.Embedding, cfg: DefineConfig) -> None:
    if cfg.n >= module.embedding_dim:
        raise ShapeError(
            f"{name}: the DeFINE map width n = {cfg.n} must be below the table's width {module.embedding_dim}"
        )
    check_head_fits(name, module, cfg.dense_head)


def _build(module: nn.Embedding, cfg: DefineConfig, ctx: Context) -> nn.Module | Skip:
    rows, dim = module.weight.shape
    tail = DefineEmbeddingSpec(rows - cfg.dense_head, dim, cfg.n, cfg.k, cfg.layers, cfg.max_groups)
    params = cfg.dense_head * dim + tail.params()
    if params >= rows * dim:
        return Skip(f"a DeFINE unit of {params:,} parameters would not save any of a {rows}×{dim} table")
    calib = ctx.require_calibration(f"the {cfg.fit} DeFINE fit") if needs_data(cfg.fit) else None
    sensitivity = calib.sensitivity(ctx.name) if needs_sensitivity(cfg.fit) else None

    def build(weight, ids):
        freq = None if calib is None else calib.counts[ids].to(torch.float64) + 1.0  # +1: unseen tokens still count
        shape = (cfg.n, cfg.k, cfg.layers, cfg.max_groups)
        return DefineEmbedding.from_weight(weight, *shape, row_weights=freq, sensitivity=sensitivity)

    if cfg.dense_head:
        return with_dense_head(module, cfg.dense_head, ctx, build)
    return build(module.weight, torch.arange(rows))


def _holds(module: nn.Module) -> bool:
    """A DeFINE unit, alone or as the tail behind a dense head."""
    return isinstance(module, DefineEmbedding) or (
        isinstance(module, HeadTailEmbedding) and isinstance(module.tail, DefineEmbedding)
    )


def _check_hybrid(values: dict[str, Any], vocab: int, head: int) -> int:
    """The hybrid's head size, checked against a table of `vocab` rows whose unit sits behind `head` exact rows."""
    if head:
        raise CompressorError(
            f"--define-export hybrid caches the unit's outputs for the most frequent tokens, but this unit already "
            f"sits behind a dense head of {head} rows (--dense-head); export it as compute or cache"
        )
    k = given(values, "define_head", HYBRID_HEAD)
    if not 0 < k < vocab:
        raise CompressorError(f"--define-head must be 1 to {vocab - 1} rows of a {vocab}-row table, got {k}")
    return k


def _check_form(form: str, values: dict[str, Any], module: nn.Module, cfg: DefineConfig) -> None:
    if form == "hybrid":
        _check_hybrid(values, module.num_embeddings, cfg.dense_head)


def _prepare(module: nn.Module, form: str, values: dict[str, Any], frequencies) -> nn.Module:
    if form == "cache":
        with torch.no_grad():
            return nn.Embedding.from_pretrained(module.to_dense())
    head = module.spec.head_size if isinstance(module, HeadTailEmbedding) else 0
    k = _check_hybrid(values, module.num_embeddings, head)
    return HybridEmbedding.from_unit(module, frequencies().head_tokens(k))


register(
    Method(
        config=DefineConfig,
        accepts=(nn.Embedding,),
        build=_build,
        compact=(DefineEmbedding, HeadTailEmbedding),
        options=field_options(DefineConfig),
        from_options=config_from_options(DefineConfig),
        check=_check,
        needs_calibration=lambda cfg: needs_data(cfg.fit) or cfg.dense_head > 0,
        needs_sensitivity=lambda cfg: needs_sensitivity(cfg.fit),
        export_forms=ExportForms(
            option=Option(
                "--define-export",
                "a DeFINE unit exported as compute (the V×n map and the small HGT: least memory), cache (the unit "
                "evaluated for every token, a V×m table behind one Gather: least latency) or hybrid (the outputs of "
                "the --define-head most frequent calibration tokens cached, the rest computed) (default: compute)",
                choices=DEFINE_FORMS,
                many=True,
            ),
            options=(
                Option(
                    "--define-head",
                    f"--define-export hybrid: cache the outputs of the K most frequent calibration tokens (default: "
                    f"{HYBRID_HEAD})",
                    int,
                ),
            ),
            holds=_holds,
            prepare=_prepare,
            check=_check_form,
            what="a DeFINE unit",
        ),
    )
)
