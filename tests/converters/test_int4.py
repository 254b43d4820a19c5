"""4-bit weights on an exported graph: MatMulNBits and GatherBlockQuantized where the fp32 weights
were, within the stated tolerance of the fp32 graph; int4-aware's smoothing exact before rounding,
its 8-bit layers within their share; and the refusals."""

import numpy as np
import onnx
import onnxruntime
import pytest

from compressor.errors import CompressorError
from converters.checkpoint import load_model
from converters.compress import compress_
from converters.export import export_onnx, sample_inputs
from converters.methods.lowrank import LowRankConfig
from converters.plan import Plan
from converters.quantization.quantize import is_quantized, quantize_onnx
from converters.quantization.registry import configs_of, scheme_named
from converters.quantization.rounding.int4 import EIGHT_BIT_SHARE, eight_bit_layers, layer_losses, quantize_4bit
from converters.quantization.rounding.smoothing import activation_absmax, smooth
from eval.graph import make_session
from eval.kinds import ENCODER


def _graph(tiny_bert_dir, tmp_path, plan=None):
    model, _ = load_model(tiny_bert_dir)
    if plan is not None:
        compress_(model, plan, progress=False)
    return export_onnx(model, tmp_path / "m.onnx").path, model.get_input_embeddings().num_embeddings


def _feeds(vocab, n=3):
    names = ("input_ids", "attention_mask")
    return [dict(zip(names, (x.numpy() for x in sample_inputs(vocab, 4, 9, seed)))) for seed in range(n)]


@pytest.mark.parametrize("plan", [None, Plan((("embeddings", LowRankConfig(rank=8, keep=None, fit="plain")),))])
@pytest.mark.parametrize("scheme", ["int4", "int4-aware"])
def test_weights_are_four_bit_and_output_within_tolerance(tiny_bert_dir, tmp_path, plan, scheme):
    fp32, vocab = _graph(tiny_bert_dir, tmp_path, plan)
    (config,) = configs_of([scheme], {"block_size": 16, "table_head": 16})  # the options a scheme takes
    result = quantize_onnx(fp32, tmp_path / "q.onnx", config, _feeds(vocab), vocab=vocab)
    assert 0 < result.parity_rel <= scheme_named("int4").gate and is_quantized(result.path)
    graph = onnx.load(str(result.path)).graph
    inits = {i.name: i for i in graph.initializer}
    assert not [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in inits]  # no fp32 weight left
    before = onnx.load(str(fp32)).graph
    weights = {i.name for i in before.initializer}
    matmuls = [n for n in before.node if n.op_type == "MatMul" and n.input[1] in weights]
    assert [n.op_type for n in graph.node].count("MatMulNBits") == len(matmuls)
    gathers = [n for n in graph.node if n.op_type == "GatherBlockQuantized"]
    eight = [g for g in gathers if any(a.name == "bits" and a.i == 8 for a in g.attribute)]
    split = scheme == "int4-aware" and plan is None  # the word table's 16 most frequent rows in 8 bits (not int4's)
    assert len(gathers) == 3 + split and len(eight) == split  # the word table (or its codes), positions, types
    four_bit = (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)
    assert all(inits[g.input[0]].data_type in four_bit for g in gathers if g not in eight)
    assert all(inits[g.input[0]].data_type == onnx.TensorProto.UINT8 for g in eight)
    floats = [i for i in graph.initializer if i.data_type == onnx.TensorProto.FLOAT and not i.name.endswith("_scales")]
    large = [i.name for i in floats if np.prod(i.dims) >= 8 * 48]
    assert not large  # every weight went to 4 bits; what stays fp32 is scales, biases and norms


def test_int4_aware_smoothing_is_exact_in_fp32(tiny_bert_dir, tmp_path):
    fp32, vocab = _graph(tiny_bert_dir, tmp_path)
    model = onnx.load(str(fp32))
    smoothed = tmp_path / "s.onnx"
    onnx.save_model(smooth(model, activation_absmax(model, _feeds(vocab)), 0.5), str(smoothed))
    feed = _feeds(vocab, 1)[0]
    (y,) = make_session(fp32).run(["last_hidden_state"], feed)
    (y_s,) = make_session(smoothed).run(["last_hidden_state"], feed)
    np.testing.assert_allclose(y_s, y, atol=1e-4)


def test_eight_bit_layers_stay_within_their_share_and_are_eight_bit(tiny_bert_dir, tmp_path):
    fp32, vocab = _graph(tiny_bert_dir, tmp_path)
    model = onnx.load(str(fp32))
    losses = layer_losses(model, _feeds(vocab), ENCODER, block=16)
    assert len(losses) == 12 and all(v > 0 for v in losses.values())  # 2 blocks × 6 linear layers
    inits = {i.name: int(np.prod(i.dims)) for i in model.graph.initializer}
    sizes = {n.name: inits[n.input[1]] for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits}
    tables = {n.input[0] for n in model.graph.node if n.op_type == "Gather" and n.input[0] in inits}
    codes = (sum(sizes.values()) + sum(inits[t] for t in tables)) / 2
    for share in (0.0, 0.02, EIGHT_BIT_SHARE, 0.5):
        chosen = eight_bit_layers(model, losses, share)
        assert sum(sizes[n] for n in chosen) / 2 <= share * codes
    wide = eight_bit_layers(model, losses, 0.5)
    assert wide and set(eight_bit_layers(model, losses, 0.02)) <= set(wide)
    quantized = quantize_4bit(model, 16, aware=True, eight_bit=tuple(wide))
    nbits = [n for n in quantized.graph.node if n.op_type == "MatMulNBits"]
    bits = {n.name: next(a.i for a in n.attribute if a.name == "bits") for n in nbits}
    assert sorted(b for name, b in bits.items() if name.removesuffix("_Q8") in wide) == [8] * len(wide)
    assert set(bits.values()) == {4, 8}


def test_bad_block_sizes_and_levels_are_refused(tiny_bert_dir, tmp_path):
    fp32, vocab = _graph(tiny_bert_dir, tmp_path)
    for block in (8, 48):
        with pytest.raises(CompressorError, match="power of two, at least 16"):
            quantize_onnx(fp32, tmp_path / "q.onnx", scheme_named("int4")(block_size=block), vocab=vocab)
    with pytest.raises(CompressorError, match="accuracy level"):
        quantize_onnx(fp32, tmp_path / "q.onnx", scheme_named("int4")(accuracy_level=7), vocab=vocab)
    with pytest.raises(CompressorError, match="int4-aware needs calibration"):
        quantize_onnx(fp32, tmp_path / "q.onnx", scheme_named("int4-aware")(), vocab=vocab)
    assert not (tmp_path / "q.onnx").exists()


def test_the_tables_take_their_own_block_and_spend_fewer_bytes_on_scales(tiny_bert_dir, tmp_path):
    fp32, vocab = _graph(tiny_bert_dir, tmp_path)

    def blocks(path) -> dict[str, set[int]]:
        nodes = onnx.load(str(path)).graph.node
        return {
            op: {a.i for n in nodes if n.op_type == op for a in n.attribute if a.name == "block_size"}
            for op in ("MatMulNBits", "GatherBlockQuantized")
        }

    same = quantize_onnx(fp32, tmp_path / "same.onnx", scheme_named("int4")(block_size=16), vocab=vocab)
    wide = quantize_onnx(fp32, tmp_path / "wide.onnx", scheme_named("int4")(block_size=16, table_block=32), vocab=vocab)
    assert blocks(same.path) == {"MatMulNBits": {16}, "GatherBlockQuantized": {16}}
    assert blocks(wide.path) == {"MatMulNBits": {16}, "GatherBlockQuantized": {32}}
    assert wide.path.stat().st_size < same.path.stat().st_size  # half the tables' scales and zero points
    assert 0 < wide.parity_rel <= scheme_named("int4").gate
    with pytest.raises(CompressorError, match="power of two, at least 16"):
        quantize_onnx(fp32, tmp_path / "bad.onnx", scheme_named("int4")(block_size=16, table_block=48), vocab=vocab)
    assert not (tmp_path / "bad.onnx").exists()


@pytest.mark.parametrize(
    "plan, written", [(None, 3), (Plan((("embeddings", LowRankConfig(rank=8, keep=None, fit="plain")),)), 4)]
)
def test_a_3_bit_table_is_said_where_no_word_table_takes_it(tiny_bert_dir, tmp_path, plan, written):
    fp32, vocab = _graph(tiny_bert_dir, tmp_path, plan)
    result = quantize_onnx(
        fp32, tmp_path / "q.onnx", scheme_named("int4-aware")(block_size=16, table_bits=3), _feeds(vocab), vocab=vocab
    )
    assert result.table_bits == written  # a low-rank table's codes (8 wide) are no whole block of 16
    assert (result.table_note(3) is None) == (written == 3) and result.table_note(written) is None


def _two_matmuls(rng):
    """y = (x W1) W2 with a third MatMul reading W1 again: a weight two nodes share stays for the one not rounded."""
    from onnx import TensorProto, helper, numpy_helper

    w1, w2 = (rng.standard_normal(shape).astype(np.float32) for shape in ((64, 64), (64, 48)))
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="first"),
        helper.make_node("MatMul", ["h", "W2"], ["y"], name="second"),
        helper.make_node("MatMul", ["x", "W1"], ["z"], name="again"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")]
    inits = [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")]
    return helper.make_model(
        helper.make_graph(nodes, "g", [x], outs, inits), opset_imports=[helper.make_opsetid("", 17)]
    )


@pytest.mark.parametrize("aware", [False, True])
@pytest.mark.parametrize("columns", [None, 8])
def test_layers_rounded_one_at_a_time_are_those_the_quantizer_makes_of_the_whole_graph(aware, columns, monkeypatch):
    import contextlib
    import io

    from onnx import numpy_helper
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        KQuantWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    from converters.quantization.rounding import one_node
    from converters.quantization.rounding.int4 import quantize_matmuls

    if columns is not None:  # each weight a slice of `columns` columns at a time, the slices joined
        monkeypatch.setattr(one_node, "SLICE_BYTES", 4 * 64 * columns)
    model = _two_matmuls(np.random.default_rng(0))
    plain = DefaultWeightOnlyQuantConfig(block_size=16, is_symmetric=True, accuracy_level=4, bits=4)
    config = KQuantWeightOnlyQuantConfig() if aware else plain
    whole = MatMulNBitsQuantizer(
        onnx.ModelProto.FromString(model.SerializeToString()),
        block_size=16,
        is_symmetric=not aware,
        accuracy_level=4,
        nodes_to_exclude=["again"],
        algo_config=config,
    )
    with contextlib.redirect_stdout(io.StringIO()):
        whole.process()
    alone = quantize_matmuls(model, 16, 4, aware, only=("first", "second"))
    arrays = [{i.name: numpy_helper.to_array(i) for i in m.graph.initializer} for m in (whole.model.model, alone)]
    assert arrays[0].keys() == arrays[1].keys() and "W1" in arrays[1] and "W2" not in arrays[1]
    assert all(np.array_equal(arrays[0][k], arrays[1][k]) for k in arrays[0])
    ops = [
        sorted((n.op_type, tuple(n.input), tuple(n.output)) for n in m.graph.node) for m in (whole.model.model, alone)
    ]
    assert ops[0] == ops[1] and [n.name for n in alone.graph.node][2] == "again"  # in the graph's own order
    feed = {"x": np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)}
    outputs = []
    for m in (whole.model.model, alone):
        session = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        outputs.append(session.run(None, feed))
    for a, b in zip(*outputs):
        np.testing.assert_array_equal(a, b)
