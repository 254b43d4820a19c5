import math

import pytest

from compressor.errors import ShapeError
from compressor.factorize import balanced_factors


@pytest.mark.parametrize(
    "n, d",
    [(30522, 2), (30522, 3), (30522, 4), (384, 2), (384, 3), (37, 2), (1, 2), (1000, 3), (97, 2)],
)
def test_factors_cover_n_and_are_balanced(n, d):
    factors = balanced_factors(n, d)
    assert len(factors) == d
    assert math.prod(factors) >= n
    assert max(factors) / min(factors) <= 1.5
    assert list(factors) == sorted(factors, reverse=True)


def test_awkward_vocabulary_is_padded_not_split_badly():
    factors = balanced_factors(30522, 2)
    assert 5087 not in factors
    assert math.prod(factors) - 30522 < 100  # a handful of zero rows, not thousands


@pytest.mark.parametrize("n, d, expected", [(384, 3, (8, 8, 6)), (384, 2, (24, 16)), (64, 3, (4, 4, 4))])
def test_exact_balanced_splits_need_no_padding(n, d, expected):
    assert balanced_factors(n, d) == expected


@pytest.mark.parametrize("n, d", [(0, 2), (10, 0), (-3, 2)])
def test_bad_sizes_raise(n, d):
    with pytest.raises(ShapeError, match="must be ≥ 1"):
        balanced_factors(n, d)
