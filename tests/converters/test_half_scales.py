"""The 4-bit graphs' block scales in half precision: stored as fp16 and cast back, the graph then
computes what the same graph with those values in fp32 computes; values fp16 cannot hold stay fp32;
the weights read back through the cast."""

import numpy as np
import onnx
import pytest
from conftest import matmul_graph
from onnx import numpy_helper

from converters.checkpoint import load_model
from converters.export import export_onnx, sample_inputs
from converters.nbits_storage import dequantize_nbits, scale_values
from converters.quantization.corrections.training import dequantize_table
from converters.quantization.quantize import quantize_onnx
from converters.quantization.registry import scheme_named
from converters.quantization.rounding.int4 import quantize_4bit
from converters.quantization.storage.half_scales import HALF_SUFFIX, SCALED_OPS, half_scales
from eval.graph import make_session


def _fp32_scales(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each half-precision scales tensor back in an fp32 initializer (its Cast dropped)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    casts = [n for n in graph.node if n.op_type == "Cast" and n.input[0].endswith(HALF_SUFFIX)]
    for cast in casts:
        graph.initializer.append(numpy_helper.from_array(scale_values(graph, cast.output[0]), cast.output[0]))
        graph.node.remove(cast)
    kept = [i for i in graph.initializer if not i.name.endswith(HALF_SUFFIX)]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model


def _run(model: onnx.ModelProto, path, feeds) -> list[np.ndarray]:
    onnx.save_model(model, str(path))
    session = make_session(path, threads=1)
    return [session.run(None, feed)[0] for feed in feeds]


@pytest.mark.parametrize("scheme", ["int4", "int4-aware"])
def test_a_four_bit_graph_stores_its_scales_in_half_precision(tiny_bert_dir, tmp_path, scheme):
    model, _ = load_model(tiny_bert_dir)
    vocab = model.get_input_embeddings().num_embeddings
    fp32 = export_onnx(model, tmp_path / "m.onnx").path
    feeds = [
        dict(zip(("input_ids", "attention_mask"), (x.numpy() for x in sample_inputs(vocab, 4, 9, s)))) for s in (0, 1)
    ]
    result = quantize_onnx(fp32, tmp_path / "q.onnx", scheme_named(scheme)(block_size=16), feeds, vocab=vocab)
    graph = onnx.load(str(result.path))
    nodes = [n for n in graph.graph.node if n.op_type in SCALED_OPS]
    inits = {i.name: i for i in graph.graph.initializer}
    assert nodes and all(n.input[2] not in inits for n in nodes)  # every scale is a Cast's output
    assert all(inits[n.input[2] + HALF_SUFFIX].data_type == onnx.TensorProto.FLOAT16 for n in nodes)
    widened = _fp32_scales(graph)
    scales = [inits[name + HALF_SUFFIX] for name in {n.input[2] for n in nodes}]
    saved = sum(i.ByteSize() for i in widened.graph.initializer) - sum(i.ByteSize() for i in graph.graph.initializer)
    assert saved >= sum(2 * int(np.prod(i.dims)) - 8 for i in scales)  # 2 bytes a scale (the names 5 longer)
    for half, wide in zip(_run(graph, tmp_path / "h.onnx", feeds), _run(widened, tmp_path / "w.onnx", feeds)):
        np.testing.assert_allclose(half, wide, rtol=1e-5, atol=1e-5)  # the same values, folded or not


def test_scales_fp16_cannot_hold_stay_in_float32():
    rng = np.random.default_rng(0)
    model = quantize_4bit(matmul_graph(rng.standard_normal((64, 32)).astype(np.float32)), block=16)
    (node,) = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    before = dequantize_nbits(model.graph, node)
    halved = half_scales(onnx.ModelProto.FromString(model.SerializeToString()))
    after = dequantize_nbits(halved.graph, node)  # read back through the Cast
    assert 0 < np.abs(after - before).max() <= np.abs(before).max() * 2.0**-11
    inits = {i.name: i for i in model.graph.initializer}
    values = numpy_helper.to_array(inits[node.input[2]]).copy()
    values[0] = 1e-7  # below fp16's normal range: it would keep a few significant bits
    inits[node.input[2]].CopyFrom(numpy_helper.from_array(values, node.input[2]))
    kept = half_scales(model)
    assert {i.name: i for i in kept.graph.initializer}[node.input[2]].data_type == onnx.TensorProto.FLOAT
    assert not [n for n in kept.graph.node if n.op_type == "Cast"]


def test_a_table_reads_back_through_the_cast(tiny_bert_dir, tmp_path):
    model, _ = load_model(tiny_bert_dir)
    fp32 = onnx.load(str(export_onnx(model, tmp_path / "m.onnx").path))
    quantized = quantize_4bit(fp32, block=16)
    (word, *_) = [n for n in quantized.graph.node if n.op_type == "GatherBlockQuantized"]
    rows = {i.name: i.dims for i in quantized.graph.initializer}[word.input[0]][0]
    before = dequantize_table(quantized, word, rows)
    after = dequantize_table(half_scales(quantized), word, rows)
    assert np.abs(after - before).max() <= np.abs(before).max() * 2.0**-11
