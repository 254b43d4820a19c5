"""recall@k's neighbours, found a block of rows at a time, are exactly those of the full N×N similarity matrix."""

import numpy as np
import pytest

from eval.quality import _neighbours, recall_at_k

N, K = 500, 10
BLOCKS = [1, 3, 7, 64, 333, 499, 500, 4096, None]  # None: the default, ~64 MB a block


def full_matrix_neighbours(emb: np.ndarray, k: int) -> np.ndarray:
    """The version blocks replaced: all N×N similarities, self −inf, every row sorted stably."""
    sim = emb @ emb.T
    np.fill_diagonal(sim, -np.inf)
    return np.argsort(-sim, axis=1, kind="stable")[:, :k]


def unit_rows(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def quantised_with_copies(seed: int, dtype) -> np.ndarray:
    """Unit rows rounded to multiples of 1/8, so every dot product is exact whatever the summation
    order (0.1 steps are not: np.round(x, 1) rows tie or not by BLAS's order); 40 rows then copied
    4 times each over other rows, as duplicate passages give."""
    rng = np.random.default_rng(seed)
    x = np.round(unit_rows(N, 16, seed) * 8) / 8
    src = rng.choice(N, 40, replace=False)
    dst = rng.choice(np.setdiff1d(np.arange(N), src), 160, replace=False)
    x[dst] = np.repeat(x[src], 4, axis=0)
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("block", BLOCKS)
def test_blocks_give_the_full_matrix_neighbours(block, seed, dtype):
    emb = unit_rows(N, 16, seed).astype(dtype)
    assert np.array_equal(_neighbours(emb, K, block=block), full_matrix_neighbours(emb, K))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("block", BLOCKS)
def test_ties_go_to_the_lower_index_as_with_the_full_matrix(block, seed, dtype):
    emb = quantised_with_copies(seed, dtype)
    sim = emb @ emb.T
    np.fill_diagonal(sim, -np.inf)
    ranked = -np.sort(-sim, axis=1)
    assert (ranked[:, K - 1] == ranked[:, K]).sum() > N // 3  # ties straddle the k-th place in many rows
    assert np.array_equal(_neighbours(emb, K, block=block), full_matrix_neighbours(emb, K))


def test_recall_of_itself_is_one_and_of_unrelated_embeddings_is_low():
    a, b = unit_rows(N, 16, 0).astype(np.float32), unit_rows(N, 16, 1).astype(np.float32)
    assert recall_at_k(a, a) == 1.0
    assert recall_at_k(a, b) < 0.1
