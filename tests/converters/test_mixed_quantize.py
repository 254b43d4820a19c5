"""One budget over rank and bits (`--quantize mixed`): each targeted layer gets a size and a width,
the bytes never above the budget, a larger budget never a larger estimated loss; the graph holds
each module at its width; bad input is one sentence."""

import copy
import json

import numpy as np
import onnx
import pytest

from compressor.errors import CompressorError, PlanError, RankError
from converters.budget import plan_for_budget
from converters.calibration import calibrate
from converters.checkpoint import load_model
from converters.compress import compress_
from converters.export import export_onnx
from converters.methods.lowrank import LowRankConfig
from converters.methods.phm import PHMConfig
from converters.plan import Plan
from converters.quantization.corrections.mixed import (
    WIDTHS,
    bytes_per_weight,
    module_nodes,
    quantization_error,
    quantize_mixed,
)
from converters.quantization.quantize import quantize_onnx
from converters.quantization.registry import scheme_named
from tests.converters.test_calibration import ALL_LINEAR as LINEAR
from tests.converters.test_calibration import TEXTS
from tests.converters.test_mixed_budget import predicted, weights
from tests.e2e.test_cli import run_cli
from texts.tokens import load_tokenizer

WORD = "embeddings.word_embeddings"


@pytest.fixture(scope="module")
def model_and_calib(tiny_bert_dir):
    model, source = load_model(tiny_bert_dir)
    calib = calibrate(model, load_tokenizer(source), TEXTS, LINEAR, batch=6, progress=False, sensitivity=True)
    return model, calib


def fp32_bytes(model) -> int:
    return 4 * sum(model.get_submodule(n).weight.numel() for n in LINEAR)


def plan_bytes(model, plan: Plan, calib) -> float:
    """The estimated bytes of the targeted modules as the plan holds them: compressed at their size,
    each weight at its width's bytes (bytes_per_weight)."""
    compressed = copy.deepcopy(model)
    compress_(compressed, plan, calib, progress=False)
    return sum(weights(compressed.get_submodule(n)) * bytes_per_weight(w) for n, w in plan.widths)


def test_quantization_error_orders_the_widths(model_and_calib):
    model, _ = model_and_calib
    for name in (LINEAR[0], WORD):
        q = [quantization_error(model.get_submodule(name), w) for w in WIDTHS]
        assert q[0] == 0 < q[1] < q[2] < 0.1


@pytest.mark.parametrize("kind", ["fisher", "plain"])
def test_the_estimated_bytes_stay_within_the_budget_and_more_never_loses_more(model_and_calib, kind):
    model, calib = model_and_calib
    total, losses = fp32_bytes(model), []
    for share in (0.1, 0.2, 0.35, 0.6):
        budget = f"{int(share * total)}B"
        plan = plan_for_budget(model, ["linear"], budget, calib, LowRankConfig(fit=kind), WIDTHS)
        assert sorted(n for n, _ in plan.widths) == sorted(LINEAR) and {w for _, w in plan.widths} <= set(WIDTHS)
        assert plan_bytes(model, plan, calib) <= share * total
        assert any("layers by width" in note for note in plan.notes)
        losses.append(sum(predicted(plan).values()))
    assert all(later <= earlier + 1e-12 for earlier, later in zip(losses, losses[1:]))
    assert losses[-1] < losses[0]


def test_a_budget_below_every_smallest_setting_names_the_smallest(model_and_calib):
    model, calib = model_and_calib
    with pytest.raises(RankError, match=r"below the smallest allocation reachable \([0-9,]+ bytes\)"):
        plan_for_budget(model, ["linear"], "100B", calib, LowRankConfig(fit="fisher"), WIDTHS)
    with pytest.raises(PlanError, match="a size in bytes"):
        plan_for_budget(model, ["linear"], "0.5", calib, LowRankConfig(fit="fisher"), WIDTHS)


def test_each_module_is_quantized_at_its_width(tiny_bert_dir, tmp_path):
    model, _ = load_model(tiny_bert_dir)
    low_rank = LowRankConfig(rank=8, keep=None, fit="plain")
    compress_(model, Plan(((LINEAR[1], low_rank), (LINEAR[4], PHMConfig(n=4, fit="plain")))), progress=False)
    fp32 = export_onnx(model, tmp_path / "m.onnx").path
    widths = {
        LINEAR[0]: "int4",
        LINEAR[1]: "int4",
        LINEAR[2]: "int8",
        WORD: "int4",
        LINEAR[3]: "fp32",
        LINEAR[4]: "int4",
    }
    graph = onnx.load(str(fp32)).graph
    nodes = module_nodes(graph, widths)
    assert len(nodes[LINEAR[1]]) == 2 and all(len(nodes[m]) == 1 for m in (LINEAR[0], LINEAR[2], WORD, LINEAR[4]))
    quantized = quantize_mixed(onnx.load(str(fp32)), widths).graph
    ops = {n.name: n.op_type for n in quantized.node}
    four = nodes[LINEAR[0]] + nodes[LINEAR[1]] + nodes[LINEAR[4]]  # PHM: its S_i MatMul; the n×n·t mixing stays
    assert [ops[f"{n}_Q4"] for n in four] == ["MatMulNBits"] * 4
    assert ops[nodes[WORD][0] + "_Q4"] == "GatherBlockQuantized" and ops[nodes[LINEAR[3]][0]] == "MatMul"
    assert any(op == "MatMulInteger" for op in ops.values())  # the int8 module, dynamically quantized
    result = quantize_onnx(fp32, tmp_path / "q.onnx", scheme_named("mixed")(), vocab=100, widths=widths)
    assert 0 < result.parity_rel <= scheme_named("mixed").gate
    with pytest.raises(CompressorError, match="no weight of the exported graph"):
        module_nodes(graph, ["encoder.layer.7.output.dense"])


def test_run_chooses_rank_and_width_and_measures_the_mixed_graph(
    tiny_bert_dir, eval_text_file, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr("eval.benchmark.SETTINGS", ((1, 16, 1),))
    args = ["--method", "lowrank", "--kind", "fisher", "--targets", "linear", "--quantize", "mixed"]
    out = tmp_path / "run"
    code, _, err = run_cli(
        capsys, "run", tiny_bert_dir, *args, "--budget", "40KB", "--eval-text", eval_text_file, "--runs", 1,
        "--second-text", "none", "--calib", eval_text_file, "--out", out,
    )  # fmt: skip
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    names = [v["name"] for v in report["variants"]]
    assert names[:2] == ["original", "original-int8"] and names[-1].endswith("-mixed"), names
    assert "original-mixed" not in names
    mixed = report["variants"][-1]
    assert set(mixed["plan"]["widths"]) == set(LINEAR) and mixed["file_bytes"] < report["variants"][-2]["file_bytes"]
    for bad in (["--budget", "0.5"], []):
        code, _, err = run_cli(capsys, "run", tiny_bert_dir, *args, *bad, "--out", tmp_path / "bad")
        assert code == 2 and "--quantize mixed chooses" in err and err.count("\n") == 1, err
    assert not (tmp_path / "bad").exists()
    assert np.isfinite(mixed["quality"]["cosine_mean"])


def test_a_plan_gives_only_known_widths():
    plan = {"version": 1, "entries": [], "widths": {LINEAR[0]: "int4"}}
    assert Plan.from_dict(plan).widths == ((LINEAR[0], "int4"),)
    with pytest.raises(PlanError, match="fp32, int8 or int4"):
        Plan.from_dict({**plan, "widths": {LINEAR[0]: "int3"}})


def test_a_plan_file_with_widths_is_refused(tiny_bert_dir, tmp_path, capsys):
    entry = {"target": LINEAR[0], "method": "lowrank", "config": {"rank": 4, "keep": None, "whiten": False}}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"version": 1, "entries": [entry], "widths": {LINEAR[0]: "int4"}}))
    code, _, err = run_cli(capsys, "compress", tiny_bert_dir, "--plan", path, "--out", tmp_path / "out")
    assert code == 2 and "byte budget chooses" in err and not (tmp_path / "out").exists(), err
