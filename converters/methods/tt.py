"""Tensor-train embeddings (Tensorized Embedding Layers, Hrinchuk et al. 2020, §4.3): the config, the build from a
trained nn.Embedding, and the registration. Fits: plain TT-SVD; aware (cores refitted to calibration token frequencies);
fisher (aware, then refitted under the embedding output's sensitivity)."""

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from compressor.errors import PlanError
from compressor.head_tail import HeadTailEmbedding
from compressor.ranks import check_rank, check_rel_eps
from compressor.token_order import TOKEN_ORDERS
from compressor.tt_embedding import TTEmbedding
from converters.methods.dense_head import DENSE_HEAD_OPTION, check_dense_head, check_head_fits, with_dense_head
from converters.methods.fit import check_fit, fit_option, needs_data, needs_sensitivity
from converters.registry import Context, Method, Option, config_from_options, field_options, option_field, register

__all__ = ["TTConfig", "TT_UNSEEN_WEIGHT"]

TT_UNSEEN_WEIGHT = 0.03  # a weighted TT row's weight is its calibration count plus this


@dataclass(frozen=True)
class TTConfig:
    """Tensor-train embedding: TT-SVD truncated at `rank` and/or relative error `rel_eps`; fitted
    `plain` (TT-SVD), `aware` (cores refitted to the calibration token frequencies) or `fisher` (then
    refitted under the embedding output's sensitivity)."""

    method: ClassVar[str] = "tt"
    rank: int | None = option_field(32, Option("--rank", "maximum TT rank", int, many=True))
    rel_eps: float | None = option_field(
        None, Option("--rel-eps", "also truncate at this relative error, in (0, 1)", float, default="off")
    )
    num_cores: int = option_field(2, Option("--cores", "number of TT cores d", int))
    order: str = option_field(
        "pca",
        Option(
            "--order",
            "token order before TT-SVD, none or by principal directions",
            choices=TOKEN_ORDERS,
            many=True,
        ),
    )
    dense_head: int = option_field(0, DENSE_HEAD_OPTION)
    fit: str = option_field(
        "plain", fit_option("cores refitted to calibration token frequencies", "TT-SVD of the table")
    )

    @property
    def weighted(self) -> bool:
        return needs_data(self.fit)

    @property
    def sensitive(self) -> bool:
        return needs_sensitivity(self.fit)

    def __post_init__(self):
        check_dense_head(self.dense_head)
        check_fit(self.fit, "TT")
        if self.weighted and self.num_cores != 2:
            raise PlanError(f"frequency-weighted TT cores are fitted for 2 cores, got num_cores={self.num_cores}")
        if self.rank is None and self.rel_eps is None:
            raise PlanError("a TT plan needs a rank, a relative error, or both; got neither")
        if self.rank is not None:
            check_rank(self.rank)
        if self.rel_eps is not None:
            check_rel_eps(self.rel_eps)
        if isinstance(self.num_cores, bool) or not isinstance(self.num_cores, int) or not 2 <= self.num_cores <= 6:
            raise PlanError(f"the number of TT cores must be an integer from 2 to 6, got {self.num_cores!r}")
        if self.order not in TOKEN_ORDERS:
            raise PlanError(f"token order must be one of {', '.join(TOKEN_ORDERS)}, got {self.order!r}")

    def label(self) -> str:
        parts = [f"r{self.rank}" if self.rank is not None else "", f"e{self.rel_eps}" if self.rel_eps else ""]
        head = [f"head{self.dense_head}"] if self.dense_head else []
        fit = [self.fit] if self.weighted else []
        return "-".join(["tt", *head, *filter(None, parts), self.order, *fit])


def _build(module: nn.Embedding, cfg: TTConfig, ctx: Context) -> nn.Module:
    calib = ctx.require_calibration("a frequency-weighted TT") if cfg.weighted else None
    sensitivity = calib.sensitivity(ctx.name) if cfg.sensitive else None

    def build(weight, ids):
        freq = None if calib is None else calib.counts[ids].to(torch.float64) + TT_UNSEEN_WEIGHT
        return TTEmbedding.from_weight(weight, cfg.rank, cfg.rel_eps, cfg.num_cores, cfg.order, freq, sensitivity)

    if cfg.dense_head:
        return with_dense_head(module, cfg.dense_head, ctx, build)
    return build(module.weight, torch.arange(module.num_embeddings))


register(
    Method(
        config=TTConfig,
        accepts=(nn.Embedding,),
        build=_build,
        compact=(TTEmbedding, HeadTailEmbedding),
        options=field_options(TTConfig),
        from_options=config_from_options(TTConfig),
        check=lambda name, module, cfg: check_head_fits(name, module, cfg.dense_head),
        needs_calibration=lambda cfg: cfg.dense_head > 0 or needs_data(cfg.fit),
        needs_sensitivity=lambda cfg: needs_sensitivity(cfg.fit),
        default=True,
    )
)
