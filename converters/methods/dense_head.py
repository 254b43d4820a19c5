"""The dense head any embedding method may keep: the rows of the K most frequent calibration
tokens stay exact and the method compresses the rest (compressor.head_tail)."""

from torch import nn

from compressor.errors import PlanError
from compressor.head_tail import HeadTailEmbedding
from converters.registry import Context, Option

__all__ = ["with_dense_head", "check_dense_head", "check_head_fits", "DENSE_HEAD_OPTION"]

DENSE_HEAD_OPTION = Option(
    "--dense-head",
    "embeddings: keep the rows of the K most frequent calibration tokens exact and compress the rest",
    int,
)


def check_dense_head(k: object) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise PlanError(f"a dense head must be a number of rows ≥ 0, got {k!r}")


def check_head_fits(name: str, module: nn.Module, k: int) -> None:
    """A table's dense head of `k` rows leaves a tail (the methods' shape check: before any calibration)."""
    if isinstance(module, nn.Embedding) and k >= module.num_embeddings:
        raise PlanError(f"{name}: a dense head of {k} rows leaves no tail of a {module.num_embeddings}-row table")


def with_dense_head(embedding: nn.Embedding, k: int, ctx: Context, build_tail) -> HeadTailEmbedding:
    """`embedding` with its K most frequent tokens' rows exact; `build_tail(weight, ids)` holds the rest."""
    check_head_fits(ctx.name, embedding, k)
    calib = ctx.require_calibration("a dense head")
    return HeadTailEmbedding.from_embedding(embedding, calib.head_tokens(k), build_tail)
