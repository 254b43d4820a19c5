"""The proof that a quantization scheme registers once: a toy scheme (dynamic int8 of the large MatMuls only)
declared and registered in this file alone quantizes a graph from the Python API and runs through `compressor
run` with an option of its own, its report fields in the row, with no edit anywhere else."""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest

import converters.quantization.registry as registry
from compressor.errors import CompressorError
from converters.checkpoint import load_model
from converters.cli import main
from converters.export import export_onnx
from converters.options import Option, option_field
from converters.quantization.quantize import TARGET_KEY, quantize_onnx
from converters.quantization.registry import QuantizeResult, SchemeConfig, Source, Written, register, scheme_named


@dataclass(frozen=True)
class LargeInt8Config(SchemeConfig):
    """ONNX Runtime's dynamic int8 (per tensor: w = s·q, one s a weight) of the MatMuls whose weight holds at least
    `min_size` entries; the rest stay fp32."""

    scheme = "int8-large"
    summary = "dynamic int8 of the large MatMuls only"
    width = 8
    gate = 0.35
    min_size: int = option_field(
        4096, Option("--min-size", "int8 the MatMuls of at least this many weights", int, neutral=4096)
    )

    def write(self, source: Source, out: Path) -> Written:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        model = source.fp32()
        graph = model.graph
        sizes = {i.name: int(np.prod(i.dims)) for i in graph.initializer}
        for k, node in enumerate(graph.node):
            node.name = node.name or f"node_{k}"
        large = [n.name for n in graph.node if n.op_type == "MatMul" and sizes.get(n.input[1], 0) >= self.min_size]
        plain = source.work / "plain.onnx"
        onnx.save_model(model, str(plain))
        quantize_dynamic(plain, out, weight_type=QuantType.QInt8, nodes_to_quantize=large)
        return Written(eight_bit=tuple(large))

    def report(self, result: QuantizeResult) -> dict:
        return {"min_size": self.min_size, "int8_layers": list(result.eight_bit)}


@pytest.fixture
def toy(monkeypatch):
    """The toy scheme registered for one test; the registry is restored after it."""
    monkeypatch.setattr(registry, "_SCHEMES", dict(registry.schemes()))
    return register(LargeInt8Config)


def test_the_python_api_quantizes_with_it(toy, tiny_bert_dir, tmp_path):
    model, _ = load_model(tiny_bert_dir)
    fp32 = export_onnx(model, tmp_path / "m.onnx").path
    vocab = model.get_input_embeddings().num_embeddings
    result = quantize_onnx(fp32, tmp_path / "q.onnx", scheme_named("int8-large")(min_size=4000), vocab=vocab)
    ops = [n.op_type for n in onnx.load(str(result.path)).graph.node]
    assert len(result.eight_bit) == 2 * 2 and ops.count("MatMulInteger") == 4  # each layer's two FFN products (48×96)
    assert result.parity_rel <= LargeInt8Config.gate
    props = {p.key for p in onnx.load(str(result.path), load_external_data=False).metadata_props}
    assert TARGET_KEY not in props  # it writes for no CPU in particular


def test_the_command_line_runs_it_with_its_option(toy, tiny_bert_dir, eval_text_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("eval.benchmark.SETTINGS", ((1, 16, 1),))
    out = tmp_path / "run"
    argv = ["run", tiny_bert_dir, "--method", "lowrank", "--rank", 8, "--targets", "embeddings", "--fit", "plain"]
    argv += ["--quantize", "int8-large", "--min-size", 4000, "--eval-text", eval_text_file, "--runs", 2, "--out", out]
    code = main([str(a) for a in argv])
    assert code == 0, capsys.readouterr().err
    variants = json.loads((out / "report.json").read_text())["variants"]
    names = [v["name"] for v in variants]
    assert names == [
        "original",
        "original-int8",
        "original-int8-large",
        "lowrank-r8-plain",
        "lowrank-r8-plain-int8-large",
    ]
    row = variants[-1]["quantization"]
    assert row["scheme"] == "int8-large" and row["min_size"] == 4000 and len(row["int8_layers"]) == 4
    assert (out / "lowrank-r8-plain-int8-large" / "onnx" / "model_quantized.onnx").is_file()


def test_its_option_goes_with_it_and_a_scheme_registered_twice_is_refused(toy, tiny_bert_dir, tmp_path, capsys):
    code = main(["run", str(tiny_bert_dir), "--quantize", "int8", "--min-size", "12", "--out", str(tmp_path / "o")])
    assert code == 2 and "--min-size goes with --quantize int8-large" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    with pytest.raises(CompressorError, match="'int8-large' is registered twice"):
        register(LargeInt8Config)
