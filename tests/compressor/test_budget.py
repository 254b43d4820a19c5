import itertools

import pytest
import torch

from compressor.budget import LayerCost, MeasuredCost, Point, allocate, allocate_ranks, lower_hull, tail_error
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


def mixed_layers(seed: int = 0) -> dict[str, list[Point]]:
    """Three layers, each with the ranks of one family (steps of 8, convex tails) and the term
    counts of another (steps of 1, losses measured: not convex, not even monotone), and dense."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (rows, cols) in {"a": (64, 64), "b": (96, 32), "c": (128, 64)}.items():
        dense = rows * cols
        spectrum = torch.sort(torch.rand(min(rows, cols), generator=g), descending=True).values
        ranks = LayerCost(name, spectrum, per_rank=rows + cols, dense=dense).points(relative=False)[:-1]
        per_term = 16 + dense // 16
        energy = float((spectrum**2).sum())
        terms = [
            Point(t, t * per_term, energy * float(torch.rand(1, generator=g)) / t, "terms")
            for t in range(1, 16)
            if t * per_term < dense
        ]
        out[name] = [*(Point(p.size, p.params, p.loss, "rank") for p in ranks), *terms, Point(None, dense, 0.0)]
    return out


@pytest.mark.parametrize("budget", [2_000, 5_000, 9_000, 15_000, 21_000, 40_000])
def test_a_mixed_budget_is_never_exceeded(budget):
    layers = mixed_layers()
    alloc = allocate(layers, budget)
    assert alloc.params <= budget
    assert alloc.params == sum(alloc.points[name].params for name in layers)
    assert all(alloc.points[name] in points for name, points in layers.items())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_more_budget_never_gives_more_loss_over_mixed_points(seed):
    layers = mixed_layers(seed)
    totals = [sum(allocate(layers, b).predicted_error.values()) for b in range(2_000, 30_000, 500)]
    assert all(b <= a + 1e-12 for a, b in zip(totals, totals[1:]))


def test_the_lower_hull_keeps_only_points_no_mix_of_others_beats():
    points = [
        Point(1, 10, 10.0, "x"),
        Point(2, 20, 9.0, "x"),  # above the segment from (10, 10) to (30, 2)
        Point(3, 30, 2.0, "y"),
        Point(4, 35, 3.0, "x"),  # more parameters, more loss: dominated
        Point(5, 50, 1.0, "y"),
        Point(None, 100, 0.0),
    ]
    assert [p.size for p in lower_hull(points)] == [1, 3, 5, None]
    drops = [(a.loss - b.loss) / (b.params - a.params) for a, b in itertools.pairwise(lower_hull(points))]
    assert drops == sorted(drops, reverse=True)


def test_each_layer_takes_the_family_with_the_better_loss_per_parameter():
    """Layer "kron" is held exactly by one term, layer "thin" by rank 8: the greedy gives each its
    exact point, whichever family it comes from, before anything else."""
    dense = 64 * 64
    kron = [Point(8, 8 * 128, 5.0, "rank"), Point(1, 272, 0.0, "terms"), Point(None, dense, 0.0)]
    thin = [Point(8, 8 * 128, 0.0, "rank"), Point(1, 272, 4.0, "terms"), Point(2, 544, 3.0, "terms")]
    alloc = allocate({"kron": kron, "thin": [*thin, Point(None, dense, 0.0)]}, 272 + 8 * 128)
    assert alloc.points["kron"].tag == "terms" and alloc.points["thin"] == Point(8, 1024, 0.0, "rank")
    assert sum(alloc.predicted_error.values()) == 0.0


def test_measured_losses_keep_the_sizes_that_save_parameters_and_lower_the_loss():
    cost = MeasuredCost(
        "m", sizes=(1, 2, 3, 4), params=(10, 20, 30, 40), losses=(6.0, 7.0, 3.0, 1.0), energy=8.0, dense=35
    )
    assert [(p.size, p.loss) for p in cost.points()] == [(1, 0.75), (3, 0.375), (None, 0.0)]
    assert [p.loss for p in cost.points(relative=False)] == [6.0, 3.0, 0.0]


def test_a_layer_cost_steps_by_its_own_step():
    spectrum = torch.ones(16)
    cost = LayerCost("t", spectrum, per_rank=20, dense=16 * 16, step=1)
    assert [p.size for p in cost.points()] == [*range(1, 13), None]  # 12·20 < 256 ≤ 13·20
    assert allocate_ranks([cost], 100).ranks["t"] == 5


def test_one_layer_gets_the_largest_rank_that_fits():
    """MiniLM's word embedding with a dense head of 2048 rows under a budget of 0.125: (0.125·30522·384
    − 2048·384) / (28474 + 384) = 23.5, so rank 23, where a grid in steps of 8 stopped at 16 (0.106)."""
    spectrum = torch.logspace(0, -2, 384)
    table = LayerCost("table", spectrum, per_rank=30522 - 2048 + 384, dense=30522 * 384, fixed=2048 * 384)
    budget = int(0.125 * table.dense)
    alloc = allocate_ranks([table], budget)
    assert alloc.ranks["table"] == (budget - table.fixed) // table.per_rank == 23
    assert budget - table.per_rank < alloc.params <= budget


def test_every_rank_is_offered_with_its_tail_error():
    cost = LayerCost("t", torch.logspace(0, -1, 16), per_rank=20, dense=16 * 16)
    points = cost.points(relative=False)
    assert [p.size for p in points] == [*range(1, 13), None]
    assert [p.loss for p in points] == pytest.approx(
        [tail_error(cost.spectrum, r, False) for r in range(1, 13)] + [0], rel=1e-5, abs=1e-9
    )
    coarse = LayerCost("t", cost.spectrum, per_rank=20, dense=16 * 16, step=8)
    assert [p.size for p in coarse.points()] == [8, 12, None]  # a coarser grid still ends at break-even


@pytest.mark.parametrize("relative", [True, False])
def test_a_larger_budget_never_spends_less_and_wastes_at_most_one_move(relative):
    many = layers()
    allocs = [allocate_ranks(many, b, relative=relative) for b in range(5_000, 40_000, 250)]
    spent = [a.params for a in allocs]
    assert all(later >= earlier for earlier, later in zip(spent, spent[1:]))
    biggest_move = max(b.params - a.params for layer in many for a, b in itertools.pairwise(layer.points()))
    for budget, alloc in zip(range(5_000, 40_000, 250), allocs):
        assert budget - biggest_move < alloc.params <= budget or alloc.params == sum(x.dense for x in many)


def _steepest_walk(points):
    """The lower hull by its definition: from the cheapest point, each time the steepest drop in loss
    per added parameter (the nearer point on a tie)."""
    here = min(points, key=lambda p: (p.params, p.loss))
    walk = [here]
    while better := [p for p in points if p.params > here.params and p.loss < here.loss]:
        here = max(better, key=lambda p: ((here.loss - p.loss) / (p.params - here.params), -p.params))
        walk.append(here)
    return walk


@pytest.mark.parametrize("seed", range(5))
def test_the_lower_hull_is_the_steepest_walk(seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(200):
        n = int(torch.randint(1, 12, (1,), generator=g))
        params = torch.randint(0, 12, (n,), generator=g).tolist()  # small integers: ties and collinear points
        losses = torch.randint(0, 12, (n,), generator=g).tolist()
        points = [Point(i, p, float(loss)) for i, (p, loss) in enumerate(zip(params, losses))]
        hull = [(p.params, p.loss) for p in lower_hull(points)]
        assert hull == [(p.params, p.loss) for p in _steepest_walk(points)], points
