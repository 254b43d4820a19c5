import pytest
import torch
from torch import nn

from compressor.errors import RankError, ShapeError
from compressor.lowrank import (
    SENSITIVITY_DAMP,
    cholesky_whitener,
    metric_factors,
    svd_factors,
    weighted_row_factors,
    whitened_factors,
)
from compressor.lowrank_embedding import LowRankEmbedding
from compressor.lowrank_linear import LowRankLinear


def data(n=400, d=24, k=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=g) * torch.logspace(0, -2, d)  # correlated, anisotropic inputs
    x = torch.randn(n, d, generator=g, dtype=torch.float32) @ mix
    return x, torch.randn(k, d, generator=g)


@pytest.mark.parametrize("aware", [False, True])
def test_full_rank_is_exact(aware):
    x, w = data()
    f = whitened_factors(w, x.T.double() @ x.double(), 16) if aware else svd_factors(w, 16)
    assert torch.allclose(f.up @ f.down, w, atol=1e-4)


def test_whitened_output_error_is_no_worse_than_plain():
    x, w = data()
    gram = x.T.double() @ x.double()
    for rank in (2, 4, 8, 12):
        plain, aware = svd_factors(w, rank), whitened_factors(w, gram, rank)
        err_plain = torch.linalg.norm((w - plain.up @ plain.down) @ x.T)
        err_aware = torch.linalg.norm((w - aware.up @ aware.down) @ x.T)
        assert err_aware <= err_plain * (1 + 1e-5), rank


def sensitivity(k=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(k, k, generator=g, dtype=torch.float64) * torch.logspace(0, -2, k, dtype=torch.float64)
    return a @ a.T  # an anisotropic output metric F


def test_output_aware_full_rank_is_exact():
    x, w = data()
    f = whitened_factors(w, x.T.double() @ x.double(), 16, sensitivity=sensitivity())
    assert torch.allclose(f.up @ f.down, w, atol=1e-4)


def test_metric_factors_tail_is_the_metric_error_and_optimal():
    """‖P (W − W') Q‖² = Σ_{j>r} σ_j², and no worse than plain or activation-aware truncation."""
    x, w = data()
    w = w.double()
    gram, fisher = x.T.double() @ x.double(), sensitivity()
    p, q = cholesky_whitener(fisher, SENSITIVITY_DAMP)[0].T, cholesky_whitener(gram)[0]
    for rank in (2, 5, 9):
        kfac = whitened_factors(w, gram, rank, sensitivity=fisher)

        def metric_error(f):
            return float(torch.linalg.norm(p @ (w - f.up.double() @ f.down.double()) @ q) ** 2)

        assert metric_error(kfac) == pytest.approx(float((kfac.spectrum[rank:] ** 2).sum()), rel=1e-4)
        assert metric_error(kfac) <= metric_error(whitened_factors(w, gram, rank)) * (1 + 1e-6)
        assert metric_error(kfac) <= metric_error(svd_factors(w, rank)) * (1 + 1e-6)


def test_diagonal_metrics_equal_their_matrices():
    _, w = data()
    left, right = torch.rand(16, dtype=torch.float64) + 0.5, torch.rand(24, dtype=torch.float64) + 0.5
    a, b = metric_factors(w, 4, left, right), metric_factors(w, 4, torch.diag(left), torch.diag(right))
    assert torch.allclose(a.up @ a.down, b.up @ b.down, atol=1e-5)


def test_error_decreases_with_rank():
    x, w = data()
    gram = x.T.double() @ x.double()
    errs = [
        float(torch.linalg.norm((w - (f.up @ f.down)) @ x.T))
        for f in (whitened_factors(w, gram, r) for r in range(1, 17))
    ]
    assert all(b <= a + 1e-4 for a, b in zip(errs, errs[1:]))


def test_singular_gram_is_regularised():
    x, w = data()
    x[:, 5:] = 0  # inputs live in a 5-dim subspace: XᵀX is singular
    s, lam = cholesky_whitener(x.T.double() @ x.double())
    assert lam > 0 and torch.isfinite(s).all()
    with pytest.warns(UserWarning, match="singular; regularised"):
        f = whitened_factors(w, x.T.double() @ x.double(), 5)
    assert torch.allclose((f.up @ f.down) @ x.T, w @ x.T, atol=1e-3)  # exact on the inputs seen


def test_frequency_weighting_lowers_the_weighted_error():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 20, generator=g)
    freq = torch.rand(300, generator=g, dtype=torch.float64) ** 8 * 1000 + 1
    plain, weighted = svd_factors(w, 5), weighted_row_factors(w, freq, 5)

    def weighted_error(f):
        return float((freq[:, None] * (w - f.up @ f.down).double() ** 2).sum())

    assert weighted_error(weighted) < weighted_error(plain)


@pytest.mark.parametrize("rank", [0, -2, 1.5])
def test_bad_ranks_raise(rank):
    with pytest.raises(RankError):
        svd_factors(torch.randn(8, 6), rank)


def test_mismatched_gram_and_weights_raise():
    with pytest.raises(ShapeError, match="does not match"):
        whitened_factors(torch.randn(8, 6), torch.eye(5), 2)
    with pytest.raises(ShapeError, match="positive"):
        weighted_row_factors(torch.randn(8, 6), torch.zeros(8), 2)
    with pytest.raises(ShapeError, match="sensitivity matrix"):
        whitened_factors(torch.randn(8, 6), torch.eye(6), 2, sensitivity=torch.eye(6))


def test_rank_above_the_shape_is_clamped():
    with pytest.warns(UserWarning, match="clamped to 6"):
        assert svd_factors(torch.randn(8, 6), 50).rank == 6


@pytest.mark.parametrize("bias", [True, False])
def test_lowrank_linear_full_rank_matches_the_layer(bias):
    torch.manual_seed(0)
    linear = nn.Linear(12, 10, bias=bias)
    lr = LowRankLinear.from_linear(linear, 10)
    x = torch.randn(3, 7, 12)
    assert torch.allclose(lr(x), linear(x), atol=1e-5)
    assert torch.allclose(lr.to_dense(), linear.weight, atol=1e-5)


def test_lowrank_embedding_forward_is_its_table():
    torch.manual_seed(0)
    w = torch.randn(50, 8)
    emb = LowRankEmbedding.from_weight(w, 8)
    assert torch.allclose(emb.to_dense(), w, atol=1e-5)
    ids = torch.tensor([[0, 49, 3]])
    small = LowRankEmbedding.from_weight(w, 3, torch.rand(50, dtype=torch.float64) + 0.5)
    assert torch.allclose(small(ids), small.to_dense()[ids], atol=1e-6)
