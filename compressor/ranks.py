"""The one place where user-given ranks and tolerances are checked and clamped."""

import warnings
from numbers import Integral, Real

from compressor.errors import RankError

__all__ = ["check_rank", "check_rel_eps", "clamp_ranks"]


def check_rank(rank: object, name: str = "rank") -> int:
    """Return `rank` as an int; a rank must be an integer ≥ 1."""
    if isinstance(rank, bool) or not isinstance(rank, Integral) or rank < 1:
        raise RankError(f"{name} must be an integer ≥ 1, got {rank!r}")
    return int(rank)


def check_rel_eps(rel_eps: object) -> float:
    """Return `rel_eps` as a float; a relative error must lie in (0, 1)."""
    if isinstance(rel_eps, bool) or not isinstance(rel_eps, Real) or not 0 < rel_eps < 1:
        raise RankError(f"relative error must be a number in (0, 1), got {rel_eps!r}")
    return float(rel_eps)


def clamp_ranks(max_rank: int, bounds: list[int], what: str) -> list[int]:
    """min(max_rank, bound) per bond; warn once, naming the bounds, when any rank was lowered."""
    ranks = [min(max_rank, b) for b in bounds]
    if max_rank > max(bounds):
        warnings.warn(
            f"{what}: rank {max_rank} is more than the shapes allow; clamped to {ranks} (the full ranks)",
            stacklevel=3,
        )
    return ranks
