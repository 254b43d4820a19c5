"""--target-cpu (converters/quantization/rounding/target_cpu.py): the int8 graphs for a CPU that sums pairs of u8 × s8
products in int16 (AVX2, AVX-512 without VNNI) hold weights no pair of which can leave int16, shown from the
quantized tensors alone, on whatever CPU the test runs; the others use the whole int8 range; a name that is no
target is refused, the targets listed."""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from compressor.errors import CompressorError
from converters.quantization.quantize import TARGET_KEY, quantize_onnx
from converters.quantization.registry import scheme_named
from converters.quantization.rounding.target_cpu import (
    INT16_MAX,
    NATIVE,
    TARGETS,
    reduces_range,
    resolve_target,
    widest_pair,
)
from eval.environment import integer_path


def _int8_weights(path) -> list[np.ndarray]:
    """The int8 initializers a graph multiplies by (its quantized weights; zero points are scalars or vectors)."""
    graph = onnx.load(str(path)).graph
    arrays = [numpy_helper.to_array(i) for i in graph.initializer if i.data_type == onnx.TensorProto.INT8]
    return [a for a in arrays if a.ndim == 2]


@pytest.mark.parametrize("scheme", ["int8", "int8-aware"])
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_each_targets_int8_weights_fit_its_integer_path(tiny_bert_graph, tmp_path, scheme, target):
    fp32, vocab, feeds = tiny_bert_graph
    result = quantize_onnx(fp32, tmp_path / "q.onnx", scheme_named(scheme)(target_cpu=target), feeds, vocab=vocab)
    weights = _int8_weights(result.path)
    assert weights, "the graph multiplies int8 weights"
    widest = max(widest_pair(w) for w in weights)
    assert (widest <= INT16_MAX) == reduces_range(target)  # 7 bits: 255 · 128 = 32,640; 8 bits go past
    props = {p.key: p.value for p in onnx.load(str(result.path), load_external_data=False).metadata_props}
    assert props[TARGET_KEY] == target


def test_native_is_this_machines_path_and_an_unknown_target_is_refused():
    assert resolve_target(NATIVE) in TARGETS and resolve_target(None) == resolve_target(NATIVE)
    assert reduces_range(NATIVE) == (integer_path() in ("avx2", "avx512", "sse"))
    with pytest.raises(CompressorError, match="--target-cpu is one of native, avx2, avx512, avx512_vnni, arm64"):
        resolve_target("avx3")


def test_the_widest_pair_is_of_the_two_largest_magnitudes():
    assert widest_pair(np.array([[1, -64], [64, 3]], np.int8)) == 255 * 128 <= INT16_MAX
    assert widest_pair(np.array([[-128, 127]], np.int8)) == 255 * 255 > INT16_MAX
