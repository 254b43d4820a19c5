import pytest
import torch

from compressor.define import group_linear, hgt_schedule, mix
from compressor.define_embedding import DefineEmbedding, DefineEmbeddingSpec
from compressor.define_fit import STEP, weighted_error
from compressor.define_hybrid import HybridEmbedding
from compressor.errors import RankError, ShapeError
from compressor.lowrank import SENSITIVITY_DAMP, weighted_row_factors

SHAPE = (8, 32, 2, 2)  # n, k, N, g_max: widths 8 → 20 → 32, groups 2, 1


def table(rows=132, dim=24, seed=0):
    """A table with a decaying spectrum, and skewed positive row weights."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, dim, generator=g) @ (torch.randn(dim, dim, generator=g) * torch.logspace(0, -1, dim))
    freq = torch.rand(rows, generator=g, dtype=torch.float64) ** 4 * 100 + 1
    return weight, freq


def random_unit(rows=50, seed=0) -> DefineEmbedding:
    torch.manual_seed(seed)
    unit = DefineEmbedding(DefineEmbeddingSpec(rows, 24, *SHAPE))
    for p in unit.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return unit


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_linear_is_a_block_diagonal_dense_layer(groups):
    weight = torch.randn(groups, 3, 5)
    x = torch.randn(7, groups * 3)
    assert torch.allclose(group_linear(x, weight), x @ torch.block_diag(*weight), atol=1e-6)


def test_the_mixer_interleaves_chunks_of_the_input_and_the_previous_output():
    e = torch.tensor([[1.0, 2, 3, 4]])
    y = torch.tensor([[10.0, 20, 30, 40, 50, 60]])
    assert mix(e, y, 2).tolist() == [[1, 2, 10, 20, 30, 3, 4, 40, 50, 60]]  # [e_1, y_1, e_2, y_2]
    assert mix(e, y, 1).tolist() == [[1, 2, 3, 4, 10, 20, 30, 40, 50, 60]]


@pytest.mark.parametrize(
    "shape, widths, groups",
    [
        ((64, 1024, 3, 4), (64, 384, 704, 1024), (4, 2, 1)),  # the defaults
        ((16, 96, 5, 8), (16, 32, 48, 64, 80, 96), (8, 4, 2, 1, 1)),
        ((8, 32, 1, 4), (8, 32), (4,)),
    ],
)
def test_widths_are_spaced_linearly_and_groups_halve(shape, widths, groups):
    schedule = hgt_schedule(*shape)
    assert (schedule.widths, schedule.groups) == (widths, groups)


@pytest.mark.parametrize(
    "shape, error, message",
    [
        ((64, 1030, 3, 4), ShapeError, "layer 1 cuts 386 into 4; k = 1025 or k = 1036 would"),
        ((30, 1024, 3, 4), ShapeError, "layer 1 cuts 30 and 361 into 4; layer 2 cuts 361 into 2; n = 28 or n = 40"),
        ((64, 100, 3, 4), ShapeError, "k must be at least 2n = 128"),
        ((64, 1024, 0, 4), RankError, "layers N must be an integer ≥ 1, got 0"),
        ((0, 1024, 3, 4), RankError, "map width n must be an integer ≥ 1"),
    ],
)
def test_bad_schedules_say_why(shape, error, message):
    with pytest.raises(error, match=message):
        hgt_schedule(*shape)


def test_the_unit_holds_its_parameters_and_looks_up_its_table():
    unit = random_unit()
    assert sum(p.numel() for p in unit.parameters()) == unit.spec.params()
    ids = torch.tensor([[0, 49, 3], [7, 7, 1]])
    assert torch.allclose(unit(ids), unit.to_dense()[ids], atol=1e-5)
    h = torch.randn(2, 5, 24)
    assert torch.allclose(unit.logits(h), h @ unit.to_dense().T, atol=1e-4)
    ids = torch.tensor([4, 0, 31])
    assert torch.allclose(unit.rows(ids).to_dense(), unit.to_dense()[ids], atol=1e-5)


def test_the_hybrid_form_equals_the_unit_on_every_token():
    unit = random_unit()
    hybrid = HybridEmbedding.from_unit(unit, torch.tensor([3, 0, 17, 42]))
    every = torch.arange(50)
    assert torch.allclose(hybrid(every), unit(every), atol=1e-6)
    assert torch.allclose(
        hybrid(torch.tensor([[0, 3], [42, 17]])), unit(torch.tensor([[0, 3], [42, 17]])), atol=1e-6
    )  # head only
    assert torch.allclose(hybrid.to_dense(), unit.to_dense(), atol=1e-6)


def metric_error(weight, freq, sensitivity, approx):
    """Σ_t f_t δ_tᵀ (F + μI) δ_t / Σ f."""
    metric = sensitivity + SENSITIVITY_DAMP * sensitivity.diagonal().mean() * torch.eye(len(sensitivity))
    delta = (approx - weight).double()
    return float((freq * ((delta @ metric) * delta).sum(-1)).sum() / freq.sum())


@pytest.mark.parametrize("fisher", [False, True])
def test_the_fit_lowers_the_weighted_error_below_the_rank_n_start(fisher):
    weight, freq = table()
    g = torch.Generator().manual_seed(1)
    a = torch.randn(24, 24, generator=g, dtype=torch.float64) * torch.logspace(0, -2, 24, dtype=torch.float64)
    sensitivity = a @ a.T if fisher else None
    start = weighted_row_factors(weight, freq, 8, sensitivity)
    unit = DefineEmbedding.from_weight(weight, *SHAPE, row_weights=freq, sensitivity=sensitivity, steps=30)
    if fisher:
        assert metric_error(weight, freq, sensitivity, unit.to_dense().detach()) < 0.8 * metric_error(
            weight, freq, sensitivity, start.up @ start.down
        )
    else:
        rank_n = float((freq * ((weight - start.up @ start.down).double() ** 2).sum(-1)).sum() / freq.sum())
        assert weighted_error(unit, weight, freq) < 0.8 * rank_n


def test_the_fitted_unit_is_stored_balanced():
    weight, freq = table()
    unit = DefineEmbedding.from_weight(weight, *SHAPE, row_weights=freq, steps=5)
    rms = [float(t.detach().pow(2).mean().sqrt()) for t in (unit.map, *unit.weights, unit.reduce)]
    assert rms == pytest.approx([rms[0]] + [rms[0] / STEP] * (len(rms) - 1), rel=1e-4)
    assert not torch.allclose(unit.scales, torch.ones(3), atol=1e-6)


def test_more_steps_fit_better_and_the_fit_is_seeded():
    weight, freq = table()
    errors = [
        weighted_error(DefineEmbedding.from_weight(weight, *SHAPE, row_weights=freq, steps=s), weight, freq)
        for s in (0, 60)
    ]
    assert errors[1] < errors[0]
    a, b = (DefineEmbedding.from_weight(weight, *SHAPE, steps=5, seed=3) for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_bad_fit_inputs_raise():
    weight, freq = table()
    with pytest.raises(ShapeError, match="row weights must be 132 positive numbers"):
        DefineEmbedding.from_weight(weight, *SHAPE, row_weights=torch.zeros(132))
    with pytest.raises(ShapeError, match="comes with row weights"):
        DefineEmbedding.from_weight(weight, *SHAPE, sensitivity=torch.eye(24))
    with pytest.raises(ShapeError, match=r"must be \(24, 24\)"):
        DefineEmbedding.from_weight(weight, *SHAPE, row_weights=freq, sensitivity=torch.eye(5))
