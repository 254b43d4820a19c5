"""PHM through the registry: plans (alone and mixed with low-rank), compress_, checkpoints, ONNX
export (parity, and no dense weight folded back in by ONNX Runtime) and the command line."""

import onnx
import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from compressor.errors import PlanError, RankError, ShapeError
from compressor.lowrank_linear import LowRankLinear
from compressor.phm import kron_sum_factors, kron_sum_to_dense
from compressor.phm_fit import kron_sum_metric_error, output_metrics
from compressor.phm_linear import PHMLinear
from converters.calibration import calibrate
from converters.checkpoint import load_model, save_compressed
from converters.cli import main
from converters.compress import compress_
from converters.export import export_onnx
from converters.methods.lowrank import LowRankConfig
from converters.methods.phm import PHMConfig
from converters.plan import Plan
from eval.graph import optimized_initializer_bytes
from texts.tokens import load_tokenizer

TEXTS = [f"the value {i} of list and dict is a string in python module" * (1 + i % 3) for i in range(24)]
FFN = [f"encoder.layer.{i}.{part}" for i in range(2) for part in ("intermediate.dense", "output.dense")]


@pytest.fixture(scope="module")
def calib(tiny_bert_dir):
    model, source = load_model(tiny_bert_dir)
    return calibrate(model, load_tokenizer(source), TEXTS, FFN, batch=6, progress=False, sensitivity=True)


def compressed(tiny_bert_dir, plan, calibration=None):
    model, source = load_model(tiny_bert_dir)
    return model, source, compress_(model, plan, calibration, progress=False)


def test_plan_round_trips_and_the_terms_default_to_n():
    plan = Plan((("ffn", PHMConfig(n=2, fit="aware")), ("attention", LowRankConfig(rank=4, keep=None))))
    assert Plan.from_json(plan.to_json()) == plan
    assert plan.entries[0][1].terms == 2 and plan.entries[0][1].label() == "phm-n2-t2-aware"


def test_mixed_plan_compresses_saves_loads_and_exports(tiny_bert_dir, tmp_path):
    attention = LowRankConfig(rank=8, keep=None, fit="plain")
    plan = Plan((("ffn", PHMConfig(n=4, fit="plain")), ("attention", attention)))
    model, source, report = compressed(tiny_bert_dir, plan)
    assert all(isinstance(model.get_submodule(n), PHMLinear) for n in FFN)
    assert isinstance(model.get_submodule("encoder.layer.0.attention.self.query"), LowRankLinear)
    assert report.modules[FFN[0]] == {
        "method": "phm",
        "params_before": 96 * 48 + 96,
        "params_after": 4 * (4 * 4 + 24 * 12) + 96,
        "spec": {"in_features": 48, "out_features": 96, "n": 4, "terms": 4, "bias": True},
    }
    loaded, _ = load_model(save_compressed(model, plan, report, source, tmp_path / "ckpt"))
    assert isinstance(loaded.get_submodule(FFN[1]), PHMLinear)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    assert export_onnx(loaded, tmp_path / "m.onnx").parity_max_abs <= 1e-4  # on shapes the tracer never saw


def test_the_graph_holds_the_factors_and_onnx_runtime_folds_nothing_into_a_dense_weight(tiny_bert_dir, tmp_path):
    original, _ = load_model(tiny_bert_dir)
    model, _, _ = compressed(tiny_bert_dir, Plan((("ffn", PHMConfig(n=4, fit="plain")),)))
    before = optimized_initializer_bytes(export_onnx(original, tmp_path / "original.onnx").path)
    path = export_onnx(model, tmp_path / "phm.onnx").path
    shapes = [tuple(i.dims) for i in onnx.load(str(path)).graph.initializer]
    assert (96, 48) not in shapes and (48, 96) not in shapes
    dense = sum(original.get_submodule(n).weight.numel() for n in FFN) * 4
    factors = sum(model.get_submodule(n).a.numel() + model.get_submodule(n).s.numel() for n in FFN) * 4
    assert optimized_initializer_bytes(path) <= before - dense + factors + 512  # + a few shape constants


@pytest.mark.parametrize("kind", ["aware", "fisher"])
def test_data_aware_kinds_lower_their_error_on_the_calibration_inputs(tiny_bert_dir, calib, tmp_path, kind):
    dense = load_model(tiny_bert_dir)[0].get_submodule(FFN[0]).weight.detach()
    gx, gy = output_metrics(calib.gram(FFN[0]), calib.sensitivity(FFN[0]) if kind == "fisher" else None, *dense.shape)
    errors = {}
    for k in ("plain", kind):
        model, _, _ = compressed(tiny_bert_dir, Plan((("ffn", PHMConfig(n=4, terms=2, fit=k)),)), calib)
        layer = model.get_submodule(FFN[0])
        errors[k] = kron_sum_metric_error(layer.a.detach(), layer.s.detach(), dense, gx, gy)
    assert errors[kind] < 0.95 * errors["plain"]
    assert export_onnx(model, tmp_path / "m.onnx").parity_max_abs <= 1e-4


def test_data_aware_kinds_need_calibration(tiny_bert_dir):
    model, _ = load_model(tiny_bert_dir)
    with pytest.raises(PlanError, match="needs calibration statistics"):
        compress_(model, Plan((("ffn", PHMConfig(fit="aware")),)), progress=False)


def test_a_sum_that_saves_nothing_leaves_the_layer_dense(tiny_bert_dir):
    model, _, report = compressed(tiny_bert_dir, Plan((("ffn", PHMConfig(n=2, terms=4, fit="plain")),)))
    assert not report.modules and "would not save parameters" in report.skipped[FFN[0]]
    assert isinstance(model.get_submodule(FFN[0]), nn.Linear)


class TinyGPT2Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = Conv1D(32, 16)  # Hugging Face's GPT-2 layer: weight (in, out)

    def forward(self, x):
        return self.c_fc(x)


def test_a_conv1d_layer_is_compressed_by_name():
    model = TinyGPT2Block()
    nn.init.normal_(model.c_fc.bias)
    weight = model.c_fc.weight.detach().T  # (out, in)
    report = compress_(model, Plan((("c_fc", PHMConfig(n=4, terms=2, fit="plain")),)), progress=False)
    assert isinstance(model.c_fc, PHMLinear) and report.modules["c_fc"]["params_after"] == 2 * (16 + 8 * 4) + 32
    nearest = kron_sum_factors(weight, 4, 2)
    assert torch.allclose(model.c_fc.to_dense(), kron_sum_to_dense(nearest.a, nearest.s), atol=1e-6)
    x = torch.randn(2, 5, 16)
    assert torch.allclose(model(x), x @ model.c_fc.to_dense().T + model.c_fc.bias, atol=1e-5)


@pytest.mark.parametrize(
    "target, config, error, message",
    [
        ("ffn", dict(n=5), ShapeError, "encoder.layer.0.intermediate.dense: the PHM block size n = 5 must divide"),
        ("embeddings", dict(n=4), PlanError, "phm applies to Linear, Conv1D, but 'embeddings.word_embeddings' is a "),
    ],
)
def test_bad_layers_are_refused_before_anything_changes(tiny_bert_dir, target, config, error, message):
    model, _ = load_model(tiny_bert_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plan = Plan((("attention", LowRankConfig(rank=4, keep=None, fit="plain")), (target, PHMConfig(**config))))
    with pytest.raises(error, match=message):
        compress_(model, plan, progress=False)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


@pytest.mark.parametrize(
    "config, error, message",
    [
        (dict(n=1), ShapeError, "n = 1 is the dense layer itself"),
        (dict(n=0), ShapeError, "an integer ≥ 2"),
        (dict(n=4, terms=0), RankError, "from 1 to n² = 16, got 0"),
        (dict(n=4, terms=17), RankError, "from 1 to n² = 16, got 17"),
        (dict(fit="clever"), PlanError, "fit is one of plain, aware, fisher"),
    ],
)
def test_bad_configs_raise(config, error, message):
    with pytest.raises(error, match=message):
        PHMConfig(**config)


def test_the_command_line_compresses_and_exports(tiny_bert_dir, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    argv = [
        "compress",
        tiny_bert_dir,
        "--method",
        "phm",
        "--n",
        4,
        "--terms",
        2,
        "--kind",
        "fisher",
        "--targets",
        "ffn",
    ]
    assert main([str(a) for a in [*argv, "--calib-passages", 16, "--out", ckpt]]) == 0, capsys.readouterr().err
    model, _ = load_model(ckpt)
    assert model.get_submodule(FFN[0]).spec.terms == 2
    assert main(["export", str(ckpt), "--out", str(tmp_path / "m.onnx")]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    "options, message",
    [
        (["--n", "5", "--targets", "ffn"], "n = 5 must divide both dimensions of a 96×48 weight; n = 2, 3, 4, 6, 8"),
        (["--n", "1", "--targets", "ffn"], "n = 1 is the dense layer itself"),
        (["--terms", "0", "--targets", "ffn"], "from 1 to n² = 16, got 0"),
        (["--terms", "17", "--targets", "ffn"], "from 1 to n² = 16, got 17"),
        (["--targets", "embeddings"], "unsupported module: phm applies to Linear, Conv1D"),
    ],
)
def test_bad_input_is_one_sentence_before_any_calibration(
    tiny_bert_dir, tmp_path, capsys, monkeypatch, options, message
):
    def no_calibration(*args, **kwargs):
        raise AssertionError("calibrated before the plan was checked")

    monkeypatch.setattr("converters.pipeline.calibrating.cached_calibration", no_calibration)
    code = main(["compress", str(tiny_bert_dir), "--method", "phm", *options, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("compressor: error:")]
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert not (tmp_path / "o").exists()
