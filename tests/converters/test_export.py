import math

import numpy as np
import onnx
import pytest
import torch

import converters.export as export
from compressor.errors import CompressorError, ExportParityError
from converters.checkpoint import load_model
from converters.compress import compress_
from converters.export import export_onnx
from converters.kinds.encoder import EncoderGraph
from converters.methods.tt import TTConfig
from converters.plan import Plan


@pytest.mark.parametrize("plan", [None, Plan((("embeddings", TTConfig(rank=4, order="pca")),))])
def test_onnx_matches_pytorch_on_unseen_ids_and_shapes(tiny_bert_dir, tmp_path, plan):
    model, _ = load_model(tiny_bert_dir)
    if plan is not None:
        compress_(model, plan, progress=False)
    result = export_onnx(model, tmp_path / "m.onnx")
    assert result.parity_max_abs <= 1e-4
    graph = onnx.load(str(result.path))
    assert graph.opset_import[0].version >= 17
    dims = [d.dim_param for d in graph.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "sequence"]
    props = {p.key: p.value for p in graph.metadata_props}
    assert float(props["compressor.parity_max_abs"]) == result.parity_max_abs


def test_tt_graph_holds_cores_not_the_table(tiny_bert_dir, tmp_path):
    model, _ = load_model(tiny_bert_dir)
    compress_(model, Plan((("embeddings", TTConfig(rank=4)),)), progress=False)
    graph = onnx.load(str(export_onnx(model, tmp_path / "m.onnx").path))
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    shapes = [tuple(i.dims) for i in graph.graph.initializer]
    assert (vocab, hidden) not in shapes
    core_elements = sum(math.prod(s) for s in shapes if len(s) >= 3)  # the cores, as (v, r, d·r')
    assert core_elements == model.get_input_embeddings().weight_like_params


def test_a_parity_failure_leaves_no_file(tiny_bert_dir, tmp_path, monkeypatch):
    model, _ = load_model(tiny_bert_dir)

    def fail(*args, **kwargs):
        raise ExportParityError("ONNX Runtime and PyTorch differ by 1 on last_hidden_state")

    monkeypatch.setattr(export, "parity_of", fail)
    with pytest.raises(ExportParityError):
        export_onnx(model, tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


def test_parity_check_catches_a_graph_that_differs(tiny_bert_dir, tmp_path):
    model, _ = load_model(tiny_bert_dir)
    path = export_onnx(model, tmp_path / "m.onnx").path
    with torch.no_grad():
        weight = model.get_input_embeddings().weight
        weight.add_(torch.randn_like(weight))  # (a constant shift would vanish in LayerNorm)
    with pytest.raises(ExportParityError, match="differ by"):
        export.check_parity(EncoderGraph(model).eval(), path, model.config.vocab_size, "last_hidden_state")


def test_old_opset_is_refused(tiny_bert_dir, tmp_path):
    model, _ = load_model(tiny_bert_dir)
    with pytest.raises(CompressorError, match="opset must be ≥ 17"):
        export_onnx(model, tmp_path / "m.onnx", opset=13)


def test_a_model_given_in_a_list_goes_before_onnx_runtime_reads_its_graph(tiny_bert_dir, tmp_path, monkeypatch):
    import gc
    import weakref

    model, _ = load_model(tiny_bert_dir)
    alive, checked = weakref.ref(model), export.parity_of

    def parity_of(*args):
        gc.collect()
        assert alive() is None  # PyTorch's outputs made, the model let go
        return checked(*args)

    monkeypatch.setattr(export, "parity_of", parity_of)
    held = [model]
    del model
    assert export_onnx(held, tmp_path / "m.onnx").parity_max_abs <= export.PARITY_ATOL
    assert held == []


@pytest.mark.parametrize("fused", [True, False])
def test_a_cached_lm_s_presents_are_checked_against_pytorch_s(fused, tiny_llama_dir, tmp_path, monkeypatch):
    from tests.conftest import write_tiny_lm

    source = write_tiny_lm(tmp_path / "llama", "llama", hidden=64) if fused else tiny_llama_dir  # 12-wide heads: traced
    model, _ = load_model(source)
    checked = export.parity_of

    def off(cases, *args):
        feed, expected = cases[0]
        assert len(expected) == 1 + 2 * model.config.num_hidden_layers  # the logits, each layer's key and value
        expected[2] = expected[2] + 1.0  # the first layer's value, as PyTorch would not have made it
        return checked(cases, *args)

    monkeypatch.setattr(export, "parity_of", off)
    with pytest.raises(ExportParityError, match=r"differ by 1 on present\S*0"):
        export_onnx(model, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


def test_the_parity_tolerance_follows_the_outputs_magnitude(tmp_path):
    """Relative (an encoder's): atol of the output's largest |value|, at least atol; else atol itself."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    big = np.full((2, 3), 500.0, dtype=np.float32)
    path = tmp_path / "m.onnx"
    assert export.parity_of([({"x": big}, [big + 0.04])], path, "y", 1e-4, relative=True) < 0.05  # within 0.05
    with pytest.raises(ExportParityError, match="tolerance 0.05"):
        export.parity_of([({"x": big}, [big + 0.06])], path, "y", 1e-4, relative=True)
    with pytest.raises(ExportParityError, match="tolerance 0.0001$"):  # absolute (an LM's logits): atol itself
        export.parity_of([({"x": big}, [big + 0.04])], path, "y", 1e-4)
    small = np.full((2, 3), 0.5, dtype=np.float32)
    with pytest.raises(ExportParityError, match="tolerance 0.0001"):  # at least atol: not below it
        export.parity_of([({"x": small}, [small + 2e-4])], path, "y", 1e-4, relative=True)
