"""Each node quantized alone (converters/quantization/rounding/one_node.py): int8 a node at a time makes the graph
ONNX Runtime's quantize_dynamic makes of the whole graph (the same nodes, weights, shapes and outputs), a Gather
whose int8 rows a MatMul reads quantized with it; the groups a quantizer takes together."""

import dataclasses

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from converters.quantization.registry import Source, scheme_named
from converters.quantization.rounding import one_node
from converters.quantization.rounding.int4 import name_nodes
from converters.quantization.rounding.one_node import groups
from eval.kinds import graph_kind
from files.onnx_files import load_onnx, save_onnx


def _factored_graph(path):
    """input_ids → a low-rank table's rows (Gather of A, then MatMul by B) → two MatMuls of that one input, added,
    times the mask: a Gather whose output a MatMul alone reads, and an input two MatMuls share."""
    rng = np.random.default_rng(0)
    weights = {
        name: rng.standard_normal(shape).astype(np.float32)
        for name, shape in (("A", (50, 8)), ("B", (8, 16)), ("W1", (16, 16)), ("W2", (16, 16)))
    }
    nodes = [
        helper.make_node("Gather", ["A", "input_ids"], ["rows"], name="rows"),
        helper.make_node("MatMul", ["rows", "B"], ["h"], name="up"),
        helper.make_node("MatMul", ["h", "W1"], ["u"], name="one"),
        helper.make_node("MatMul", ["h", "W2"], ["v"], name="two"),
        helper.make_node("Add", ["u", "v"], ["s"], name="add"),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Unsqueeze", ["m", "axis"], ["m3"], name="unsqueeze"),
        helper.make_node("Mul", ["s", "m3"], ["last_hidden_state"], name="mask"),
    ]
    inits = [numpy_helper.from_array(w, name) for name, w in weights.items()]
    inits.append(numpy_helper.from_array(np.array([2], np.int64), "axis"))
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "t"]) for n in ("input_ids", "attention_mask")]
    out = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["b", "t", 16])]
    graph = helper.make_graph(nodes, "factored", ids, out, inits)
    save_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _both(fp32, vocab, tmp_path, per_channel=None):
    """(quantize_dynamic's graph of the whole, int8's of each node) of the fp32 graph at `fp32` (`per_channel`: as
    its kind scales int8 weights, else that way)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    config = scheme_named("int8")(target_cpu="avx512_vnni")
    work = tmp_path / "work"
    work.mkdir()
    kind = graph_kind(fp32)
    kind = kind if per_channel is None else dataclasses.replace(kind, int8_per_channel=per_channel)
    source = Source(fp32, kind, vocab, None, work)
    plain = source.fp32()
    name_nodes(plain.graph)
    save_onnx(plain, tmp_path / "plain.onnx")
    per_channel = source.kind.int8_per_channel
    quantize_dynamic(
        tmp_path / "plain.onnx", tmp_path / "whole.onnx", per_channel=per_channel, weight_type=QuantType.QInt8
    )
    config.write(source, tmp_path / "each.onnx")
    return tmp_path / "whole.onnx", tmp_path / "each.onnx"


def _assert_same(whole, each, vocab):
    a, b = load_onnx(whole), load_onnx(each)
    wired = [{(n.op_type, tuple(n.input), tuple(n.output)) for n in m.graph.node} for m in (a, b)]
    assert wired[0] == wired[1]
    values = [{i.name: numpy_helper.to_array(i) for i in m.graph.initializer} for m in (a, b)]
    assert values[0].keys() == values[1].keys()
    assert all(np.array_equal(values[0][k], values[1][k]) for k in values[0])
    made = {o for n in b.graph.node for o in n.output}
    assert {v.name for v in a.graph.value_info} & made <= {v.name for v in b.graph.value_info}  # fusions read them
    ids = np.random.default_rng(1).integers(0, vocab, (3, 7))
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    outs = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, feed)[0] for p in (whole, each)]
    assert np.allclose(outs[0], outs[1], rtol=1e-6, atol=1e-6 * float(np.abs(outs[0]).max()))


def test_int8_a_node_at_a_time_is_the_whole_graphs_int8(tiny_bert_graph, tmp_path):
    fp32, vocab, _ = tiny_bert_graph
    _assert_same(*_both(fp32, vocab, tmp_path), vocab)


@pytest.mark.parametrize("per_channel", [True, False])
def test_int8_of_wide_weights_a_slice_at_a_time_is_the_whole_graphs_int8(
    tiny_bert_graph, tmp_path, monkeypatch, per_channel
):
    fp32, vocab, _ = tiny_bert_graph
    monkeypatch.setattr(one_node, "SLICE_BYTES", 4 * 96)  # its MatMuls' columns and (per tensor) its tables' rows
    whole, cut = one_node.sliced, []
    monkeypatch.setattr(one_node, "sliced", lambda model, node, *a: cut.append(node.op_type) or whole(model, node, *a))
    _assert_same(*_both(fp32, vocab, tmp_path, per_channel), vocab)
    assert set(cut) == ({"MatMul"} if per_channel else {"MatMul", "Gather"})  # per tensor at the whole one's range


def test_a_gathers_int8_rows_go_to_the_matmul_that_reads_them(tmp_path):
    fp32 = _factored_graph(tmp_path / "factored.onnx")
    whole, each = _both(fp32, 50, tmp_path)
    _assert_same(whole, each, 50)
    graph = load_onnx(each).graph
    up = next(n for n in graph.node if n.op_type == "MatMulInteger" and n.input[1].startswith("B"))
    assert next(n for n in graph.node if up.input[0] in n.output).op_type == "Gather"  # int8 rows, no round trip


def test_groups_join_the_nodes_that_read_one_another(tmp_path):
    graph = load_onnx(_factored_graph(tmp_path / "factored.onnx")).graph
    named = [[n.name for n in group] for group in groups(graph, {"rows", "up", "one", "two", "mask"})]
    assert named == [["rows", "up", "one", "two"], ["mask"]]  # one and two read up's output
    assert [[n.name for n in group] for group in groups(graph, {"one", "two"})] == [["one"], ["two"]]
