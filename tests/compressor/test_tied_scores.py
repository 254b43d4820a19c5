"""Normalised tied scores (Liu et al.): each variant matches its formula on a dense table; row norms
from the factors of every compact table equal the formed table's; the l2 variant normalises the
input lookup too, and releasing the head removes that."""

import pytest
import torch
from torch import nn

from compressor.define_embedding import DefineEmbedding
from compressor.errors import ShapeError
from compressor.head_tail import HeadTailEmbedding
from compressor.lowrank_embedding import LowRankEmbedding
from compressor.tied_logits import TiedLogits
from compressor.tt_embedding import TTEmbedding
from compressor.tying import SCORES, row_norms, tied_scores

torch.manual_seed(0)
TABLE = torch.randn(101, 12, dtype=torch.float64)

TABLES = {
    "dense": lambda: nn.Embedding.from_pretrained(TABLE),
    "lowrank": lambda: LowRankEmbedding.from_weight(TABLE, 5),
    "tt": lambda: TTEmbedding.from_weight(TABLE, rank=8),
    "tt-pca-order": lambda: TTEmbedding.from_weight(TABLE, rank=8, order="pca"),
    "tt-3-cores": lambda: TTEmbedding.from_weight(TABLE, rank=4, num_cores=3),
    "head-tail": lambda: HeadTailEmbedding.from_embedding(
        nn.Embedding.from_pretrained(TABLE), [3, 50, 7], lambda w, ids: LowRankEmbedding.from_weight(w, 4)
    ),
    "define": lambda: DefineEmbedding.from_weight(TABLE.float(), n=4, k=16, layers=2, max_groups=2).double(),
}


@pytest.mark.parametrize("name", TABLES)
def test_row_norms_from_the_factors_equal_the_formed_tables(name):
    table = TABLES[name]()
    dense = table.weight if isinstance(table, nn.Embedding) else table.to_dense()
    torch.testing.assert_close(row_norms(table), dense.norm(dim=1), rtol=1e-9, atol=1e-9)


def test_tt_with_padded_columns_refuses_row_norms_in_one_sentence():
    table = TTEmbedding.from_weight(torch.randn(30, 7, dtype=torch.float64), rank=3)
    assert table.spec.col_dims == (3, 3)  # 7 columns held as 9
    with pytest.raises(ShapeError, match="padded columns"):
        row_norms(table)


def formula(score: str, w: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Liu et al. §2.2, written out on the dense table."""
    norms = w.norm(dim=1)
    return {
        "dot": h @ w.T,
        "l2": h @ (w / norms[:, None]).T,
        "square": h @ (w / norms[:, None] ** 2).T,
        "distance": h @ w.T - 0.5 * norms**2,
        "cosine": (h @ w.T) / norms,
    }[score]


@pytest.mark.parametrize("score", SCORES)
def test_each_score_matches_its_formula_on_a_dense_table(score):
    h = torch.randn(4, 6, 12, dtype=torch.float64)
    head = TiedLogits(nn.Embedding.from_pretrained(TABLE), score)
    torch.testing.assert_close(head(h), formula(score, TABLE, h), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(
        tied_scores(h @ TABLE.T, TABLE.norm(dim=1), score), formula(score, TABLE, h), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("score", ["square", "cosine", "distance"])
def test_scores_through_the_factors_equal_the_formed_tables(score):
    table = TABLES["lowrank"]()
    h = torch.randn(3, 12, dtype=torch.float64)
    torch.testing.assert_close(TiedLogits(table, score)(h), formula(score, table.to_dense(), h), rtol=1e-4, atol=1e-5)


def test_l2_normalises_the_input_lookup_too_until_released():
    embedding = nn.Embedding.from_pretrained(TABLE)
    ids = torch.tensor([[1, 5, 100]])
    head = TiedLogits(embedding, "l2")
    unit = TABLE / TABLE.norm(dim=1, keepdim=True)
    torch.testing.assert_close(embedding(ids), unit[ids], rtol=1e-4, atol=1e-5)
    head.release()
    torch.testing.assert_close(embedding(ids), TABLE[ids], rtol=1e-4, atol=1e-5)


def test_a_bias_is_added_after_the_score_and_an_unknown_score_is_refused():
    bias = torch.randn(101, dtype=torch.float64)
    h = torch.randn(2, 12, dtype=torch.float64)
    head = TiedLogits(nn.Embedding.from_pretrained(TABLE), "cosine", bias)
    torch.testing.assert_close(head(h), formula("cosine", TABLE, h) + bias, rtol=1e-4, atol=1e-5)
    assert [n for n, _ in head.named_parameters()] == ["bias"]  # the table stays the embedding's
    with pytest.raises(ValueError, match="unknown tied score"):
        TiedLogits(nn.Embedding.from_pretrained(TABLE), "euclid")
