import pytest
import torch
from torch import nn

from compressor.errors import ShapeError
from compressor.token_order import principal_order
from compressor.tt_embedding import TTEmbedding, TTEmbeddingSpec


def table(v: int, d: int, seed: int = 0) -> nn.Embedding:
    torch.manual_seed(seed)
    return nn.Embedding(v, d)


@pytest.mark.parametrize("v, d", [(1000, 48), (97, 37), (30, 8)])
@pytest.mark.parametrize("cores", [2, 3])
@pytest.mark.parametrize("order", ["none", "pca"])
def test_full_rank_is_exact_and_forward_is_the_table(v, d, cores, order):
    emb = table(v, d)
    tt = TTEmbedding.from_embedding(emb, rank=None, rel_eps=None, num_cores=cores, order=order)
    assert torch.allclose(tt.to_dense(), emb.weight, atol=1e-5)
    ids = torch.randint(0, v, (3, 11))
    ids[0, 0], ids[-1, -1] = v - 1, 0  # the last real token and the first
    assert torch.allclose(tt(ids), tt.to_dense()[ids], atol=1e-6)


def test_truncated_forward_is_the_truncated_table():
    emb = table(1000, 48)
    tt = TTEmbedding.from_embedding(emb, rank=8, order="pca")
    ids = torch.arange(1000).reshape(10, 100)
    assert torch.allclose(tt(ids), tt.to_dense()[ids], atol=1e-6)
    assert tt.weight_like_params < emb.weight.numel() / 5


def test_padded_rows_are_never_returned():
    emb = table(97, 37)  # 97 rows and 37 columns both need padding
    tt = TTEmbedding.from_embedding(emb, rank=None, order="pca")
    assert sorted(tt.permutation.tolist()) == list(range(97))  # only real rows are addressed
    assert tt(torch.arange(97)).shape == (97, 37)


def test_error_does_not_grow_with_rank():
    emb = table(500, 32)
    errs = [
        float(torch.linalg.norm(TTEmbedding.from_embedding(emb, rank=r).to_dense().detach() - emb.weight.detach()))
        for r in (1, 2, 4, 8, 16, 32, 64)
    ]
    assert all(b <= a + 1e-5 for a, b in zip(errs, errs[1:]))


def test_principal_order_groups_rows_by_leading_principal_coordinate():
    w = torch.randn(200, 16, dtype=torch.float64)
    perm = principal_order(w, (20, 10))
    centred = w - w.mean(0)
    pc1 = centred @ torch.linalg.svd(centred, full_matrices=False)[2][0]
    block = perm // 10  # i_1 of each token
    # every token of a lower block has a lower first principal coordinate
    for b in range(19):
        assert pc1[block == b].max() <= pc1[block == b + 1].min()


def test_forward_never_builds_the_table(monkeypatch):
    tt = TTEmbedding.from_embedding(table(100, 16), rank=4)
    monkeypatch.setattr(TTEmbedding, "to_dense", lambda self: pytest.fail("forward built the table"))
    tt(torch.tensor([[1, 2, 99]]))


def test_unknown_order_and_inconsistent_spec_raise():
    with pytest.raises(ShapeError, match="token order"):
        TTEmbedding.from_embedding(table(10, 4), order="random")
    with pytest.raises(ShapeError, match="do not cover"):
        TTEmbeddingSpec(100, 16, (5, 5), (4, 4), (3,), False)
