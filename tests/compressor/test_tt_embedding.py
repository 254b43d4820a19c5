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


def clustered_table(clusters: int, size: int, dim: int) -> torch.Tensor:
    """`clusters` tight, well separated groups of `size` rows each, rows shuffled."""
    g = torch.Generator().manual_seed(0)
    centres = 10 * torch.randn(clusters, dim, generator=g)
    rows = centres.repeat_interleave(size, 0) + 0.01 * torch.randn(clusters * size, dim, generator=g)
    return rows[torch.randperm(clusters * size, generator=g)]


def test_principal_order_places_each_cluster_on_consecutive_rows():
    w = clustered_table(clusters=4, size=32, dim=12)
    perm = principal_order(w)
    assert sorted(perm.tolist()) == list(range(128))
    by_row = w[torch.argsort(perm)]  # the table in TT row order
    for block in by_row.split(32):
        assert (block - block.mean(0)).abs().max() < 0.1  # one cluster per block of 32 rows


def test_principal_order_lowers_the_tt_error_of_a_clustered_table():
    emb = nn.Embedding.from_pretrained(clustered_table(clusters=16, size=16, dim=16))
    errors = {
        order: float(torch.linalg.norm(TTEmbedding.from_embedding(emb, rank=4, order=order).to_dense() - emb.weight))
        for order in ("none", "pca")
    }
    assert errors["pca"] < 0.5 * errors["none"]


def test_forward_never_builds_the_table(monkeypatch):
    tt = TTEmbedding.from_embedding(table(100, 16), rank=4)
    monkeypatch.setattr(TTEmbedding, "to_dense", lambda self: pytest.fail("forward built the table"))
    tt(torch.tensor([[1, 2, 99]]))


def test_unknown_order_and_inconsistent_spec_raise():
    with pytest.raises(ShapeError, match="token order"):
        TTEmbedding.from_embedding(table(10, 4), order="random")
    with pytest.raises(ShapeError, match="do not cover"):
        TTEmbeddingSpec(100, 16, (5, 5), (4, 4), (3,), False)


def test_sensitivity_refit_lowers_the_error_it_measures_and_needs_row_weights():
    weight = table(97, 24).weight.detach()
    torch.manual_seed(1)
    f = torch.rand(97, dtype=torch.float64) * 10
    root = torch.randn(24, 24, dtype=torch.float64)
    sensitivity = root @ root.T + torch.diag(torch.linspace(0, 30, 24, dtype=torch.float64))

    def error(module):
        d = (module.to_dense() - weight).double()
        return float((f[:, None] * (d @ sensitivity) * d).sum())

    weighted = TTEmbedding.from_weight(weight, rank=4, row_weights=f)
    refit = TTEmbedding.from_weight(weight, rank=4, row_weights=f, sensitivity=sensitivity)
    assert error(refit) < error(weighted)
    with pytest.raises(ShapeError, match="row weights"):
        TTEmbedding.from_weight(weight, rank=4, sensitivity=sensitivity)
