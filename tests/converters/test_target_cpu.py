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
from tests.conftest import run_cli


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


def test_several_targets_are_one_file_each_under_sentence_transformers_names(tiny_bert_dir, tmp_path, capsys):
    """--target-cpu avx2,avx512_vnni: onnx/model_qint8_avx2.onnx and model_qint8_avx512_vnni.onnx in one folder,
    each bounded for its path and named in its metadata; bench takes the one asked and refuses one not there."""
    from files.model_folder import graph_in, targets_held

    out = tmp_path / "folder"
    code, _, err = run_cli(
        capsys, "export", tiny_bert_dir, "--quantize", "int8-aware", "--target-cpu", "avx2,avx512_vnni", "--out", out
    )
    assert code == 0, err
    held = targets_held(out)
    assert sorted(p.name for p in held.values()) == ["model_qint8_avx2.onnx", "model_qint8_avx512_vnni.onnx"]
    for target, graph in held.items():
        props = {p.key: p.value for p in onnx.load(str(graph), load_external_data=False).metadata_props}
        assert props[TARGET_KEY] == target
        widest = max(widest_pair(w) for w in _int8_weights(graph))
        assert (widest <= INT16_MAX) == reduces_range(target)
    assert graph_in(out, "avx2") == held["avx2"] and graph_in(out, fallback="avx512_vnni") == held["avx512_vnni"]
    with pytest.raises(CompressorError, match="holds graphs for avx2, avx512_vnni .*not for arm64"):
        graph_in(out, "arm64")
    with pytest.raises(CompressorError, match="was written for avx2, not avx512_vnni"):
        graph_in(held["avx2"], "avx512_vnni")
    code, _, err = run_cli(capsys, "bench", out, out, "--target-cpu", "arm64", "--json", tmp_path / "r.json")
    assert code == 2 and "not for arm64" in err and not (tmp_path / "r.json").exists()


def test_several_targets_need_a_folder_and_known_names(tiny_bert_dir, tmp_path, capsys):
    for targets, said in (("avx2,avx512_vnni", "give --out a folder"), ("avx2,avx3", "got 'avx3'")):
        code, _, err = run_cli(
            capsys, "export", tiny_bert_dir, "--quantize", "int8", "--target-cpu", targets, "--out", tmp_path / "q.onnx"
        )
        assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "q.onnx").exists()
