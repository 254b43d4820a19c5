"""Block scales in one byte: each scale within half a step of its row's log grid, a zero scale kept at 0, the
graph computing what `byte_scale_values` reads back, in one byte a block and 4 a row."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from converters.quantization.rounding.int4 import quantize_4bit
from converters.quantization.storage.byte_scales import PARTS, ZERO_CODE, _codes, byte_scale_values, byte_scales
from eval.graph import make_session

K, N, BLOCK = 128, 48, 16


def _matmul():
    """x @ W of a random (K, N) weight, one column 50× the others, in 4 bits (MatMulNBits, fp32 scales)."""
    weight = np.random.default_rng(0).standard_normal((K, N)).astype(np.float32)
    weight[:, 3] *= 50  # rows of very different scales: the log grid spans them
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", N])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return quantize_4bit(model, BLOCK, accuracy_level=0, aware=True)  # k-quant: positive scales


def _run(model, tmp_path, x):
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path))
    return make_session(path).run(None, {"x": x})[0]


def test_each_scale_within_half_a_step_of_its_rows_log_grid_and_zeros_kept():
    rng = np.random.default_rng(2)
    scales = np.exp(rng.uniform(-9, 3, size=(N, 8)))  # rows spanning up to e¹² of range
    scales[4, 2] = 0.0
    u, a, d = _codes(scales)
    back = byte_scale_values(u, a, d)
    assert u[4, 2] == ZERO_CODE and back[4, 2] == 0 and (u[scales > 0] < ZERO_CODE).all()
    positive = scales > 0
    log_error = np.abs(np.log(back[positive]) - np.log(scales[positive]))
    step = np.broadcast_to(d.astype(np.float64), scales.shape)[positive]
    assert (log_error <= 0.5 * step * 1.01 + 1e-6).all() and log_error.max() > 0.1 * step.max()
    assert a.dtype == d.dtype == np.float16 and u.dtype == np.uint8


def test_the_graph_computes_the_scales_read_back(tmp_path):
    model = _matmul()
    name = next(n for n in model.graph.node if n.op_type == "MatMulNBits").input[2]
    x = np.random.default_rng(1).standard_normal((5, K)).astype(np.float32)
    reference = onnx.ModelProto()
    reference.CopyFrom(model)
    byte_scales(model)
    stored = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert name not in stored and sum(stored[f"{name}_{p}"].nbytes for p in PARTS) == N * (K // BLOCK) + 4 * N
    back = byte_scale_values(*(stored[f"{name}_{p}"] for p in PARTS))
    for init in reference.graph.initializer:
        if init.name == name:
            init.CopyFrom(numpy_helper.from_array(back.reshape(numpy_helper.to_array(init).shape), name))
    ours, expected = _run(model, tmp_path, x), _run(reference, tmp_path, x)
    assert np.abs(ours - expected).max() <= 1e-5 * np.abs(expected).max()  # the scales the graph folds
