"""The proof that a method registers once: a toy method (diagonal plus low-rank, for square linear
layers) declared and registered in this file alone runs through plan → compress → save → load →
export → bench, from the Python API and from the command line, with no edit anywhere else."""

import json
from dataclasses import asdict, dataclass
from typing import ClassVar

import pytest
import torch
from torch import Tensor, nn

import converters.registry as registry
from compressor.errors import CompressorError
from converters.checkpoint import load_model, save_compressed
from converters.cli import main
from converters.compress import compress_
from converters.export import export_onnx
from converters.methods.tt import TTConfig
from converters.plan import Plan
from converters.registry import Method, Option, Skip, given, register


@dataclass(frozen=True)
class DiagLowRankSpec:
    features: int
    rank: int

    def to_dict(self) -> dict:
        return asdict(self)


class DiagLowRankLinear(nn.Module):
    """y = d ⊙ x + U (V x) + b: W ≈ diag(d) + U V, d the diagonal of W, U V the truncated SVD of the rest."""

    spec_type = DiagLowRankSpec

    def __init__(self, spec: DiagLowRankSpec):
        super().__init__()
        self.spec = spec
        self.diagonal = nn.Parameter(torch.zeros(spec.features))
        self.up = nn.Parameter(torch.zeros(spec.features, spec.rank))
        self.down = nn.Parameter(torch.zeros(spec.rank, spec.features))
        self.bias = nn.Parameter(torch.zeros(spec.features))

    @classmethod
    def from_linear(cls, linear: nn.Linear, rank: int) -> "DiagLowRankLinear":
        w = linear.weight.detach()
        d = w.diagonal()
        u, s, vh = torch.linalg.svd(w - torch.diag(d))
        module = cls(DiagLowRankSpec(w.shape[0], rank))
        with torch.no_grad():
            module.diagonal.copy_(d)
            module.up.copy_(u[:, :rank] * s[:rank])
            module.down.copy_(vh[:rank])
            module.bias.copy_(linear.bias)
        return module

    def to_dense(self) -> Tensor:
        return torch.diag(self.diagonal) + self.up @ self.down

    def forward(self, x: Tensor) -> Tensor:
        return x * self.diagonal + (x @ self.down.T) @ self.up.T + self.bias


@dataclass(frozen=True)
class DiagLowRankConfig:
    method: ClassVar[str] = "diaglr"
    rank: int = 4

    def label(self) -> str:
        return f"diaglr-r{self.rank}"


def _build(module: nn.Linear, cfg: DiagLowRankConfig, ctx) -> nn.Module | Skip:
    if module.in_features != module.out_features or module.bias is None:
        return Skip("diagonal plus low-rank needs a square layer with a bias")
    return DiagLowRankLinear.from_linear(module, cfg.rank)


TOY = Method(
    config=DiagLowRankConfig,
    accepts=(nn.Linear,),
    build=_build,
    compact=(DiagLowRankLinear,),
    options=(Option("--rank", "the rank of the off-diagonal part (default: 4)", int, many=True),),
    from_options=lambda o: DiagLowRankConfig(rank=given(o, "rank", 4)),
)


@pytest.fixture
def toy(monkeypatch):
    """The toy method registered for one test; the registry is restored after it."""
    monkeypatch.setattr(registry, "_METHODS", dict(registry.methods()))
    return register(TOY)


def test_full_rank_is_exact():
    linear = nn.Linear(6, 6)
    toy = DiagLowRankLinear.from_linear(linear, 6)
    assert torch.allclose(toy.to_dense(), linear.weight, atol=1e-5)
    x = torch.randn(3, 6)
    assert torch.allclose(toy(x), linear(x), atol=1e-5)


def test_plan_compress_save_load_export(toy, tiny_bert_dir, tmp_path):
    model, source = load_model(tiny_bert_dir)
    plan = Plan((("attention", DiagLowRankConfig(rank=3)),))
    assert Plan.from_json(plan.to_json()) == plan  # the plan's JSON reads the registry
    report = compress_(model, plan, progress=False)
    assert isinstance(model.get_submodule("encoder.layer.0.attention.self.query"), DiagLowRankLinear)
    assert report.modules["encoder.layer.0.attention.self.query"]["method"] == "diaglr"
    path = save_compressed(model, plan, report, source, tmp_path / "ckpt")
    loaded, _ = load_model(path)  # the checkpoint's module table reads the registry
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in model.state_dict().items())
    assert export_onnx(loaded, tmp_path / "toy.onnx").parity_max_abs <= 1e-4


def test_the_command_line_runs_it(toy, tiny_bert_dir, eval_text_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("eval.benchmark.SETTINGS", ((1, 16, 1),))
    out = tmp_path / "run"
    argv = ["run", tiny_bert_dir, "--method", "diaglr", "--rank", "2", "8", "--targets", "attention"]
    code = main([str(a) for a in [*argv, "--eval-text", eval_text_file, "--runs", 2, "--out", out]])
    assert code == 0, capsys.readouterr().err
    variants = json.loads((out / "report.json").read_text())["variants"]
    assert [v["name"] for v in variants] == ["original", "original-int8", "diaglr-r2", "diaglr-r8"]
    assert variants[2]["params"] < variants[3]["params"] < variants[0]["params"]
    assert all(v["parity_max_abs"] <= 1e-4 for v in variants[2:])


def test_an_option_of_another_method_is_refused(toy, tiny_bert_dir, tmp_path, capsys):
    code = main(["compress", str(tiny_bert_dir), "--method", "diaglr", "--keep", "0.3", "--out", str(tmp_path / "o")])
    assert code == 2 and "--keep is an option of --method lowrank, not of diaglr" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_method_registered_twice_is_refused(toy):
    twice = Method(config=TTConfig, accepts=(nn.Embedding,), build=_build, compact=(), from_options=TTConfig)
    with pytest.raises(CompressorError, match="'tt' is registered twice"):
        register(twice)
    with pytest.raises(CompressorError, match="'diaglr' is registered twice"):
        register(TOY)
