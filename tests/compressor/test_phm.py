import re

import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from compressor.errors import PlanError, RankError, ShapeError
from compressor.phm import kron_rearrange, kron_sum_factors, kron_sum_to_dense
from compressor.phm_fit import kron_sum_metric_error, kron_sum_refit, output_metrics
from compressor.phm_linear import PHMLinear


def weight(rows=24, cols=16, seed=0, dtype=torch.float32):
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def calibration(rows=24, cols=16, samples=400, seed=1):
    """Correlated, anisotropic inputs X (their Gram XᵀX) and an anisotropic output sensitivity F."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, cols, generator=g, dtype=torch.float64) @ (
        torch.randn(cols, cols, generator=g, dtype=torch.float64) * torch.logspace(0, -2, cols, dtype=torch.float64)
    )
    root = torch.randn(rows, rows, generator=g, dtype=torch.float64) * torch.logspace(0, -2, rows, dtype=torch.float64)
    return x, x.T @ x, root @ root.T


def relative(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float(torch.linalg.norm(a - b) / torch.linalg.norm(b))


@pytest.mark.parametrize("shape, n", [((24, 16), 4), ((16, 24), 2), ((12, 36), 3), ((64, 64), 8)])
def test_n_squared_terms_are_exact(shape, n):
    w = weight(*shape)
    f = kron_sum_factors(w, n, n * n)
    assert relative(kron_sum_to_dense(f.a, f.s), w) <= 1e-5
    assert f.a.shape == (n * n, n, n) and f.s.shape == (n * n, shape[0] // n, shape[1] // n)


def test_the_rearrangement_puts_each_block_in_a_row_and_a_kronecker_product_at_rank_one():
    w = weight()
    r = kron_rearrange(w, 4)  # blocks of 6×4
    assert torch.equal(r[1 * 4 + 2], w[6:12, 8:12].reshape(-1))
    a, s = torch.randn(4, 4), torch.randn(6, 4)
    assert torch.allclose(kron_rearrange(torch.kron(a, s), 4), a.reshape(-1, 1) * s.reshape(1, -1), atol=1e-6)


def test_error_never_increases_with_terms_and_is_the_spectrum_tail():
    w = weight(dtype=torch.float64)
    errors = []
    for t in range(1, 17):
        f = kron_sum_factors(w, 4, t)
        errors.append(float(torch.linalg.norm(w - kron_sum_to_dense(f.a, f.s)) ** 2))
        assert errors[-1] == pytest.approx(float((f.spectrum[t:] ** 2).sum()), rel=1e-6, abs=1e-9)
    assert all(later <= earlier * (1 + 1e-9) for earlier, later in zip(errors, errors[1:]))
    assert errors[0] > 2 * errors[7] > 0  # the terms matter


def test_terms_are_balanced():
    f = kron_sum_factors(weight(), 4, 4)
    rms_a, rms_s = f.a.pow(2).mean(dim=(1, 2)).sqrt(), f.s.pow(2).mean(dim=(1, 2)).sqrt()
    assert torch.allclose(rms_a, rms_s, rtol=1e-4)


@pytest.mark.parametrize("terms", [1, 3, 16])
@pytest.mark.parametrize("layer_type", ["linear", "conv1d"])
def test_forward_is_x_times_the_dense_sum_plus_bias(layer_type, terms):
    torch.manual_seed(0)
    layer = nn.Linear(16, 24) if layer_type == "linear" else Conv1D(24, 16)
    if layer_type == "conv1d":
        nn.init.normal_(layer.bias)
    phm = PHMLinear.from_linear(layer, 4, terms)
    for x in (torch.randn(2, 3, 16), torch.randn(5, 16), torch.randn(16)):
        expected = x @ phm.to_dense().T + layer.bias
        assert torch.allclose(phm(x), expected, atol=1e-5)
        assert phm(x).shape == x.shape[:-1] + (24,)
    if terms == 16:  # exact: the layer itself
        x = torch.randn(2, 3, 16)
        assert torch.allclose(phm(x), layer(x), atol=1e-5)


def test_conv1d_weight_is_read_transposed():
    conv = Conv1D(24, 16)  # weight (in, out)
    phm = PHMLinear.from_linear(conv, 4, 16)
    assert phm.spec.in_features == 16 and phm.spec.out_features == 24
    assert relative(phm.to_dense(), conv.weight.T) <= 1e-5


def test_from_linear_keeps_dtype_and_bias_and_defaults_to_n_terms():
    layer = nn.Linear(16, 24, bias=False).to(torch.float64)
    phm = PHMLinear.from_linear(layer, 2)
    assert phm.spec.terms == 2 and phm.bias is None
    assert phm.a.dtype == phm.s.dtype == torch.float64 and phm.a.device == layer.weight.device
    assert sum(p.numel() for p in phm.parameters()) == 2 * (2 * 2 + 24 * 16 // 4)


@pytest.mark.parametrize("terms", [1, 2, 4])
def test_aware_fit_lowers_the_output_error_on_the_calibration_inputs(terms):
    w = weight(dtype=torch.float64)
    x, gram, _ = calibration()
    plain = kron_sum_factors(w, 4, terms)
    aware = kron_sum_refit(plain.a, plain.s, w, gram)

    def output_error(a, s):
        return float(torch.linalg.norm((w - kron_sum_to_dense(a, s)) @ x.T))

    assert output_error(*aware) <= 0.9 * output_error(plain.a, plain.s)


@pytest.mark.parametrize("terms", [1, 2, 4])
def test_fisher_fit_lowers_the_output_error_under_the_sensitivity(terms):
    w = weight(dtype=torch.float64)
    _, gram, fisher = calibration()
    gx, gy = output_metrics(gram, fisher, *w.shape)
    plain = kron_sum_factors(w, 4, terms)
    aware = kron_sum_refit(plain.a, plain.s, w, gram)
    sensitive = kron_sum_refit(plain.a, plain.s, w, gram, fisher)

    def metric_error(a, s):  # ‖Lᵀ (W − H) S‖²
        return kron_sum_metric_error(a, s, w, gx, gy)

    assert metric_error(*sensitive) <= 0.9 * metric_error(plain.a, plain.s)
    assert metric_error(*sensitive) < metric_error(*aware)  # the sensitivity is used


@pytest.mark.parametrize("with_sensitivity", [False, True])
def test_the_refit_recovers_an_exact_kronecker_sum_from_a_perturbed_start(with_sensitivity):
    g = torch.Generator().manual_seed(3)
    a, s = (
        torch.randn(2, 4, 4, generator=g, dtype=torch.float64),
        torch.randn(2, 6, 4, generator=g, dtype=torch.float64),
    )
    w = kron_sum_to_dense(a, s)
    _, gram, fisher = calibration()
    start_a = a + 0.3 * torch.randn(a.shape, generator=g, dtype=torch.float64)
    start_s = s + 0.3 * torch.randn(s.shape, generator=g, dtype=torch.float64)
    fit = kron_sum_refit(start_a, start_s, w, gram, fisher if with_sensitivity else None, sweeps=200, tol=0)
    assert relative(kron_sum_to_dense(*fit), w) <= 1e-4 < relative(kron_sum_to_dense(start_a, start_s), w)


def test_data_aware_layer_is_refitted_and_its_forward_follows_its_factors():
    layer = nn.Linear(16, 24)
    _, gram, fisher = calibration()
    phm = PHMLinear.from_linear(layer, 4, 2, gram, fisher)
    x = torch.randn(3, 16)
    assert torch.allclose(phm(x), x @ phm.to_dense().T + layer.bias, atol=1e-5)
    assert relative(phm.to_dense(), layer.weight) > relative(
        PHMLinear.from_linear(layer, 4, 2).to_dense(), layer.weight
    )


@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            lambda: kron_sum_factors(weight(), 5, 4),
            ShapeError,
            "n = 5 must divide both dimensions of a 24×16 weight; n = 2, 4, 8 would",
        ),
        (lambda: kron_sum_factors(weight(15, 7), 2, 4), ShapeError, "no n ≥ 2 divides both"),
        (lambda: kron_sum_factors(weight(), 1, 1), ShapeError, "n = 1 is the dense layer itself"),
        (lambda: kron_sum_factors(weight(), 4, 0), RankError, "from 1 to n² = 16, got 0"),
        (lambda: kron_sum_factors(weight(), 4, 17), RankError, "from 1 to n² = 16, got 17"),
        (lambda: PHMLinear.from_linear(nn.Embedding(24, 16), 4), PlanError, "not a Embedding"),
        (lambda: PHMLinear.from_linear(nn.Linear(16, 24), 4, gram=torch.eye(15)), ShapeError, "16 inputs"),
        (lambda: PHMLinear.from_linear(nn.Linear(16, 24), 4, sensitivity=torch.eye(24)), ShapeError, "Gram"),
    ],
)
def test_bad_input_is_one_clear_sentence(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call()


def test_terms_beyond_what_the_shapes_allow_are_clamped_and_said():
    with pytest.warns(UserWarning, match="clamped to 4"):
        f = kron_sum_factors(weight(8, 8), 4, 9)  # blocks of 2×2: R(W) is 16 × 4, of rank ≤ 4
    assert f.terms == 4 and relative(kron_sum_to_dense(f.a, f.s), weight(8, 8)) <= 1e-5
