"""Balanced factorization of a dimension, padding it up when it factors badly.

30522 = 2·3·5087 has no useful split; the smallest n' ≥ 30522 whose d factors are within
`max_ratio` of each other is taken instead (the padding rows are zeros, never looked up).
"""

import math
from collections.abc import Iterator

from compressor.errors import ShapeError

__all__ = ["balanced_factors"]


def _splits(n: int, d: int, low: int) -> Iterator[tuple[int, ...]]:
    """Every non-decreasing tuple of d factors ≥ low whose product is n."""
    if d == 1:
        if n >= low:
            yield (n,)
        return
    f = low
    while f**d <= n:
        if n % f == 0:
            for rest in _splits(n // f, d - 1, f):
                yield (f, *rest)
        f += 1


def balanced_factors(n: int, d: int, max_ratio: float = 1.5) -> tuple[int, ...]:
    """Factors (descending) of the smallest n' ≥ n that splits into d factors with max/min ≤
    max_ratio; among the splits of n', the one with the smallest max/min."""
    if n < 1 or d < 1:
        raise ShapeError(f"a dimension and a number of factors must be ≥ 1, got n={n}, d={d}")
    if d == 1:
        return (n,)
    low = max(2, math.floor(n ** (1 / d) / max_ratio))
    for m in range(n, 2 * n + 2**d):
        best = min(_splits(m, d, low), key=lambda s: s[-1] / s[0], default=None)
        if best is not None and best[-1] / best[0] <= max_ratio:
            return tuple(sorted(best, reverse=True))
    raise ShapeError(f"found no split of {n} (padded up to {2 * n}) into {d} balanced factors")
