"""Recall@k's neighbours found in row blocks give exactly what the full similarity matrix gave."""

import numpy as np
import pytest

from eval.quality import _neighbours, recall_at_k


def full_matrix_neighbours(emb: np.ndarray, k: int) -> np.ndarray:
    """The way it was done before blocks: all N×N similarities, every row sorted."""
    sim = emb @ emb.T
    np.fill_diagonal(sim, -np.inf)
    return np.argsort(-sim, axis=1, kind="stable")[:, :k]


def normalised(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("block", [1, 7, 64, 500, None])
def test_blocks_give_the_full_matrix_neighbours(seed, block):
    emb = normalised(500, 16, seed)
    assert np.array_equal(_neighbours(emb, 10, block), full_matrix_neighbours(emb, 10))


@pytest.mark.parametrize("block", [1, 33, None])
def test_ties_go_to_the_lower_index_as_before(block):
    """Integer-valued embeddings make every dot product exact, so ties are real whatever the
    summation order; duplicated rows tie with their copies."""
    x = np.random.default_rng(2).integers(-2, 3, (300, 6)).astype(np.float32)
    emb = np.concatenate([x, x[:50], x[:50]])
    assert np.array_equal(_neighbours(emb, 10, block), full_matrix_neighbours(emb, 10))


def test_recall_of_itself_is_one_and_of_unrelated_embeddings_is_low():
    emb = normalised(400, 32, 3)
    assert recall_at_k(emb, emb, 10) == 1.0
    assert recall_at_k(emb, normalised(400, 32, 4), 10) < 0.2
