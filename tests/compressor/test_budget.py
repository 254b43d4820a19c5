import pytest
import torch

from compressor.budget import LayerCost, allocate_ranks, tail_error
from compressor.errors import RankError


def layers():
    g = torch.Generator().manual_seed(0)
    return [
        LayerCost("flat", torch.sort(torch.rand(64, generator=g), descending=True).values, per_rank=128, dense=64 * 64),
        LayerCost("steep", torch.logspace(0, -4, 64), per_rank=128, dense=64 * 64),
        LayerCost("wide", torch.logspace(0, -1, 96), per_rank=96 + 256, dense=96 * 256),
    ]


@pytest.mark.parametrize("budget", [5_000, 6_000, 12_000, 20_000])
def test_budget_is_never_exceeded(budget):
    alloc = allocate_ranks(layers(), budget)
    assert alloc.params <= budget
    assert alloc.params == sum(layer.cost(alloc.ranks[layer.name]) for layer in layers())


@pytest.mark.parametrize("relative", [True, False])
def test_more_budget_never_gives_more_error(relative):
    totals = [
        sum(allocate_ranks(layers(), b, relative=relative).predicted_error.values())
        for b in range(5_000, 40_000, 1_000)
    ]
    assert all(b <= a + 1e-12 for a, b in zip(totals, totals[1:]))


def test_steep_spectra_get_less_rank_than_flat_ones():
    ranks = allocate_ranks(layers(), 8_000).ranks
    assert ranks["steep"] is not None  # compressed
    assert ranks["flat"] is None or ranks["steep"] < ranks["flat"]  # None: the flat layer stayed dense


def test_a_budget_below_the_smallest_allocation_raises():
    with pytest.raises(RankError, match="below the smallest allocation"):
        allocate_ranks(layers(), 100)


def test_tail_error_is_relative_energy_or_absolute():
    s = torch.tensor([2.0, 1.0, 1.0])
    assert tail_error(s, 1) == pytest.approx(2 / 6)
    assert tail_error(s, 1, relative=False) == pytest.approx(2.0)
    assert tail_error(s, None) == 0.0


def test_absolute_errors_favour_the_layer_whose_loss_is_larger():
    """The same spectrum scaled ×10 (a layer the output feels more) gets more rank, but only
    when errors are summed in common units."""
    base = torch.logspace(0, -1, 64)
    two = [
        LayerCost("felt", base * 10, per_rank=128, dense=64 * 64),
        LayerCost("quiet", base, per_rank=128, dense=64 * 64),
    ]
    absolute = allocate_ranks(two, 4_096, relative=False).ranks
    assert absolute["felt"] > absolute["quiet"]
    relative = allocate_ranks(two, 4_096).ranks
    assert relative["felt"] == relative["quiet"]
