"""Linear layers in 3 bits: the rounding keeps each weight within half a step of its block's 8 levels and its
range search never loses to the plain range; the planes' storage is lossless (the graph computes bit for bit
what the 4-bit layout did, alone and folded into int8 products) in 3 bits a code; widths other than 4 and 3, a
scheme without a correction and an LM are refused."""

import copy
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper, version_converter

from compressor.errors import CompressorError
from converters.nbits_storage import dequantize_nbits
from converters.quantization.corrections.int8_products import int8_products
from converters.quantization.registry import check_options, scheme_named
from converters.quantization.rounding.int4 import quantize_matmuls
from converters.quantization.rounding.three_bit_linear import _rounded, three_bit_layers, three_bit_storage
from eval.graph import make_session
from tests.conftest import matmul_graph

K, N, BLOCK = 256, 96, 32


def _weight():
    return np.random.default_rng(3).standard_normal((K, N)).astype(np.float32)


def _quantized(bits: int) -> onnx.ModelProto:
    model = version_converter.convert_version(matmul_graph(_weight()), 21)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return quantize_matmuls(model, BLOCK, 0, aware=True, bits=bits)


def _run(model, tmp_path, x):
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path))
    return make_session(path).run(None, {"x": x})[0]


def test_three_bit_rounding_within_half_a_step_and_no_worse_than_the_plain_range():
    blocks = _weight().T.reshape(N, K // BLOCK, BLOCK)
    codes, scale, zero = _rounded(blocks)
    assert codes.max() <= 7 and zero.max() <= 7 and codes.dtype == np.uint8
    rounded = (codes.astype(np.float32) - zero[..., None]) * scale[..., None]
    error = np.abs(rounded - blocks)
    steps = np.broadcast_to(scale[..., None], error.shape)
    kept = (codes > 0) & (codes < 7)  # a shrunk range clips its extremes to the end codes
    assert (error[kept] <= 0.5001 * steps[kept]).all()
    low, high = np.minimum(blocks.min(-1), 0), np.maximum(blocks.max(-1), 0)
    plain_scale = ((high - low) / 7).astype(np.float16).astype(np.float32)[..., None]
    plain_zero = np.clip(np.round(-low[..., None] / plain_scale), 0, 7)
    plain = (np.clip(np.round(blocks / plain_scale) + plain_zero, 0, 7) - plain_zero) * plain_scale
    ours, theirs = (((values - blocks) ** 2).sum(-1) for values in (rounded, plain))
    assert (ours <= theirs + 1e-9).all() and (ours < theirs).mean() > 0.5  # the search pays on most blocks


def test_planes_store_the_codes_losslessly_in_three_bits(tmp_path):
    model = _quantized(3)
    (node,) = model.graph.node
    assert [n.name for n in three_bit_layers(model)] == [node.name]
    assert not three_bit_layers(_quantized(4))  # 4-bit codes use all 16 levels
    x = np.random.default_rng(4).standard_normal((5, K)).astype(np.float32)
    before = _run(model, tmp_path, x)
    weight = dequantize_nbits(model.graph, node)
    stored = three_bit_storage(copy.deepcopy(model))
    inits = {i.name: numpy_helper.to_array(i) for i in stored.graph.initializer}
    assert node.input[1] not in inits  # the 4-bit codes rebuilt at session start, not stored
    planes = sum(v.nbytes for name, v in inits.items() if name.startswith(node.input[1]) and v.dtype == np.uint8)
    assert planes == K * N * 3 // 8
    assert np.array_equal(_run(stored, tmp_path, x), before)  # bit for bit
    np.testing.assert_allclose(before, x @ weight, rtol=1e-4, atol=1e-4 * np.abs(before).max())
    folded, plain = int8_products(copy.deepcopy(stored)), int8_products(copy.deepcopy(model))
    assert "MatMulNBits" not in {n.op_type for n in folded.graph.node}
    assert np.array_equal(_run(folded, tmp_path, x), _run(plain, tmp_path, x))


def test_bad_widths_are_refused():
    encoder, lm = SimpleNamespace(factor_form="int8"), SimpleNamespace(factor_form="int4")
    with pytest.raises(CompressorError, match="one of 4, 3"):
        scheme_named("w4a8")(linear_bits=2)
    with pytest.raises(CompressorError, match="goes with"):
        check_options(["int8", "int4-aware"], {"linear_bits": 3})
    with pytest.raises(CompressorError, match="encoder"):
        scheme_named("int4-trained")(linear_bits=3).check(lm)
    check_options(["int8", "int4-trained"], {"linear_bits": 3})
    scheme_named("int4-trained")(linear_bits=3).check(encoder)
    scheme_named("int4-trained")().check(lm)
