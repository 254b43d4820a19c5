"""Tensor-train embeddings (DESIGN §2.1): the config, the build from a trained nn.Embedding, and
the registration. Kinds: plain TT-SVD; aware (cores refitted to calibration token frequencies);
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
from converters.registry import Context, Method, Option, given, register

__all__ = ["TTConfig", "TT_KINDS", "TT_UNSEEN_WEIGHT"]

TT_KINDS = ("plain", "aware", "fisher")
TT_UNSEEN_WEIGHT = 0.03  # a weighted TT row's weight is its calibration count plus this


@dataclass(frozen=True)
class TTConfig:
    """Tensor-train embedding: TT-SVD truncated at `rank` and/or relative error `rel_eps`; with
    `weighted`, cores refitted to the calibration token frequencies (needs calibration), and with
    `sensitive` also under the embedding output's sensitivity (the "fisher" kind)."""

    method: ClassVar[str] = "tt"
    rank: int | None = 32
    rel_eps: float | None = None
    num_cores: int = 2
    order: str = "pca"
    dense_head: int = 0  # keep the rows of this many most frequent tokens exact (needs calibration)
    weighted: bool = False
    sensitive: bool = False

    @classmethod
    def of_kind(cls, kind: str, **options) -> "TTConfig":
        if kind not in TT_KINDS:
            raise PlanError(f"a TT kind is one of {', '.join(TT_KINDS)}, got {kind!r}")
        return cls(weighted=kind != "plain", sensitive=kind == "fisher", **options)

    @property
    def kind(self) -> str:
        return "fisher" if self.sensitive else "aware" if self.weighted else "plain"

    def __post_init__(self):
        check_dense_head(self.dense_head)
        if self.sensitive and not self.weighted:
            raise PlanError("output sensitivity (fisher) builds on frequency-weighted TT cores")
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
        kind = [self.kind] if self.weighted else []
        return "-".join(["tt", *head, *filter(None, parts), self.order, *kind])


def _build(module: nn.Embedding, cfg: TTConfig, ctx: Context) -> nn.Module:
    calib = ctx.require_calibration("a frequency-weighted TT") if cfg.weighted else None
    sensitivity = calib.sensitivity(ctx.name) if cfg.sensitive else None

    def build(weight, ids):
        freq = None if calib is None else calib.counts[ids].to(torch.float64) + TT_UNSEEN_WEIGHT
        return TTEmbedding.from_weight(weight, cfg.rank, cfg.rel_eps, cfg.num_cores, cfg.order, freq, sensitivity)

    if cfg.dense_head:
        return with_dense_head(module, cfg.dense_head, ctx, build)
    return build(module.weight, torch.arange(module.num_embeddings))


def _from_options(o: dict) -> TTConfig:
    return TTConfig.of_kind(
        given(o, "kind", "plain"),
        rank=given(o, "rank", 32),
        rel_eps=o.get("rel_eps"),
        num_cores=given(o, "cores", 2),
        order=given(o, "order", "pca"),
        dense_head=given(o, "dense_head", 0),
    )


register(
    Method(
        config=TTConfig,
        accepts=(nn.Embedding,),
        build=_build,
        compact=(TTEmbedding, HeadTailEmbedding),
        options=(
            Option("--rank", "maximum TT rank (default: 32)", int, many=True),
            Option(
                "--order",
                "token order before TT-SVD, none or by principal directions (default: pca)",
                choices=TOKEN_ORDERS,
                many=True,
            ),
            Option(
                "--kind",
                "aware (cores refitted to calibration token frequencies), fisher (aware, then refitted under the "
                "embedding output's sensitivity) or plain TT-SVD (default: plain)",
                choices=TT_KINDS,
                many=True,
            ),
            Option("--rel-eps", "also truncate at this relative error, in (0, 1) (default: off)", float),
            Option("--cores", "number of TT cores d (default: 2)", int),
            DENSE_HEAD_OPTION,
        ),
        from_options=_from_options,
        check=lambda name, module, cfg: check_head_fits(name, module, cfg.dense_head),
        needs_calibration=lambda cfg: cfg.dense_head > 0 or cfg.weighted,
        needs_sensitivity=lambda cfg: cfg.sensitive,
        default=True,
    )
)
