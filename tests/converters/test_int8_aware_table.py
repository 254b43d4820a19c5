"""int8-aware-table (converters/quantization/schemes/int8_aware_table.py): int8-aware's products with the word
table in 3 or 4 bits: a smaller file than int8-aware's, every product still int8 (nothing folded at session
start), within its gate; an LM refused."""

import onnx
import pytest

from compressor.errors import CompressorError
from converters.checkpoint import load_model
from converters.export import export_onnx
from converters.quantization.quantize import quantize_onnx
from converters.quantization.registry import scheme_named
from converters.quantization.rounding.target_cpu import INT16_MAX, widest_pair
from eval.kinds import graph_kind
from tests.conftest import write_tiny_lm


@pytest.mark.parametrize("bits", [3, 4])
def test_the_word_table_narrows_and_every_product_stays_int8(tiny_bert_graph, tmp_path, bits):
    fp32, vocab, feeds = tiny_bert_graph
    config = scheme_named("int8-aware-table")(table_bits=bits, table_head=8, table_block=16, target_cpu="avx2")
    table = quantize_onnx(fp32, tmp_path / "table.onnx", config, feeds, vocab=vocab)
    assert table.table_bits == bits and table.parity_rel < config.gate
    graph = onnx.load(str(table.path)).graph
    weights = {i.name for i in graph.initializer}
    ops = {n.op_type for n in graph.node}
    float_products = [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    assert "MatMulNBits" not in ops and not float_products and ops & {"MatMulInteger", "DynamicQuantizeMatMul"}
    assert "GatherBlockQuantized" in ops  # the tables read in blocks, not as int8
    int8 = [onnx.numpy_helper.to_array(i) for i in graph.initializer if i.data_type == onnx.TensorProto.INT8]
    assert max(widest_pair(w) for w in int8 if w.ndim == 2) <= INT16_MAX  # avx2's 7-bit weights still


def test_an_lm_is_refused(tmp_path):
    model, _ = load_model(write_tiny_lm(tmp_path / "lm"))
    fp32 = export_onnx(model, tmp_path / "lm.onnx").path
    with pytest.raises(CompressorError, match="narrows an encoder's word table"):
        scheme_named("int8-aware-table")().check(graph_kind(fp32))


@pytest.mark.parametrize("scheme", ["int8-aware-table", "int8-w4"])
def test_a_graph_without_a_word_table_to_narrow_is_refused_nothing_written(tiny_bert_graph, tmp_path, scheme):
    fp32, vocab, feeds = tiny_bert_graph
    model = onnx.load(str(fp32))  # its tables read ids the graph computes (an Identity here), none the input's
    for node in model.graph.node:
        node.input[:] = ["ids" if name == "input_ids" and node.op_type == "Gather" else name for name in node.input]
    model.graph.node.insert(0, onnx.helper.make_node("Identity", ["input_ids"], ["ids"]))
    onnx.save_model(model, str(tmp_path / "computed.onnx"))
    config = scheme_named(scheme)()
    with pytest.raises(CompressorError, match=f"{scheme} narrows the word table, and this graph reads none"):
        quantize_onnx(tmp_path / "computed.onnx", tmp_path / "t.onnx", config, feeds, vocab=vocab)
    assert [p.name for p in tmp_path.iterdir()] == ["computed.onnx"]
