"""The fused decoder's int8 key-value cache (converters/quantization/kv_cache.py, `compressor export --kv-cache int8`):
int8 pasts and presents, per-channel scales that hold the calibration text's keys and values, decoding that stays
near the fp32 cache's, and every graph or model it cannot go into refused before any work."""

import importlib.util
import json

import numpy as np
import onnx
import pytest

from converters.quantization.kv_cache import attends_by_gqa, cache_scales
from decoding.decoders import open_decoder
from decoding.sampling import decode_ids
from eval.graph import make_session
from eval.probe import PAST, PRESENT
from tests.conftest import genai_greedy, run_cli, write_tiny_lm

STEPS = 12


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny Llama whose heads GroupQueryAttention takes, exported with an fp32 and an int8 cache."""
    from converters.cli import main

    root = tmp_path_factory.mktemp("cache")
    source = write_tiny_lm(root / "llama", "llama", hidden=64)
    for cache in ("fp32", "int8"):
        assert main(["export", str(source), "--out", str(root / cache), "--kv-cache", cache]) == 0
    return root


def test_the_cache_is_int8_with_a_scale_per_head_and_channel(folders):
    graph = onnx.load(folders / "int8/onnx/model.onnx")
    caches = [io for io in (*graph.graph.input, *graph.graph.output) if io.name.startswith((PAST, PRESENT))]
    assert caches and {io.type.tensor_type.elem_type for io in caches} == {onnx.TensorProto.INT8}
    scales = {i.name: onnx.numpy_helper.to_array(i) for i in graph.graph.initializer if i.name.endswith(".scale")}
    config = json.loads((folders / "int8/config.json").read_text())
    kv_heads, head_dim = config["num_key_value_heads"], config["hidden_size"] // config["num_attention_heads"]
    assert len(scales) == 2 * config["num_hidden_layers"]
    assert {s.shape for s in scales.values()} == {(1, kv_heads, 1, head_dim)} and all(
        (s > 0).all() for s in scales.values()
    )


def test_scales_hold_the_largest_key_and_value_of_the_text(folders):
    session = make_session(folders / "fp32/onnx/model.onnx")
    ids = np.array([[3, 7, 11, 5, 9, 2, 4]])
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    scales = cache_scales(folders / "fp32/onnx/model.onnx", [batch])
    decoder = open_decoder(session)
    decoder.start(ids[0])
    for name, past in decoder.past.items():
        present = name.replace(PAST, PRESENT, 1)
        top = np.abs(past).max(axis=(0, 2), keepdims=True)
        np.testing.assert_allclose(scales[present] * 127, top, rtol=1e-5)


def test_decoding_with_the_int8_cache_stays_near_the_fp32_caches(folders):
    plain = open_decoder(make_session(folders / "fp32/onnx/model.onnx"))
    rounded = open_decoder(make_session(folders / "int8/onnx/model.onnx"))
    ids = [3, 7, 11, 5, 9]
    pairs = [(plain.start(np.array(ids)), rounded.start(np.array(ids)))]
    for token in (4, 8, 1, 6, 2, 10, 12, 3):
        pairs.append((plain.step(token), rounded.step(token)))
    for a, b in pairs:  # keys and values off by half a step of s = max / 127 at most: well under a tenth of the spread
        assert np.abs(a - b).max() <= 0.1 * (a.max() - a.min())
    assert np.isfinite(np.stack([b for _, b in pairs])).all()


def test_generate_reads_the_int8_cache(folders, capsys):
    code, out, err = run_cli(capsys, "generate", folders / "int8", "--prompt", "the value of", "--max-new-tokens", 4)
    assert code == 0 and out.startswith("the value of"), err


def test_a_graph_that_attends_otherwise_has_no_gqa(tiny_llama_dir, tmp_path, capsys):
    assert run_cli(capsys, "export", tiny_llama_dir, "--out", tmp_path / "traced")[0] == 0
    assert not attends_by_gqa(onnx.load(tmp_path / "traced/onnx/model.onnx", load_external_data=False))


@pytest.mark.parametrize(
    ("model", "said"), [("bert", "is a causal LM's cache"), ("llama", "fused decoder's attention")]
)
def test_a_model_the_int8_cache_cannot_go_into_is_refused(tiny_bert_dir, tiny_llama_dir, tmp_path, capsys, model, said):
    source = {"bert": tiny_bert_dir, "llama": tiny_llama_dir}[model]  # the tiny Llama's heads of 12: not fused
    code, _, err = run_cli(capsys, "export", source, "--out", tmp_path / "out", "--kv-cache", "int8")
    assert code == 2 and said in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("cache", ["int8", "fp32"])
def test_an_lm_runs_quantized_rows_get_the_asked_cache_and_the_original_keeps_fp32(
    folders, lm_text, tmp_path, capsys, cache
):
    texts = ("--calib", lm_text, "--eval-text", lm_text, "--second-text", "none")
    argv = ("run", folders / "llama", *texts, "--quantize", "int4", "--runs", 1, "--kv-cache", cache)
    code, _, err = run_cli(capsys, *argv, "--out", tmp_path / "run")
    assert code == 0, err
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    detail = next(v for v in report["variants"] if v["name"] == "original-int4")
    assert detail["quantization"]["kv_cache"] == cache
    for row, wanted in (("original", "fp32"), ("original-int4", cache)):
        graph = next((tmp_path / "run" / row / "onnx").glob("*.onnx"))
        past = next(i for i in onnx.load(graph, load_external_data=False).graph.input if i.name.startswith(PAST))
        elem = {"int8": onnx.TensorProto.INT8, "fp32": onnx.TensorProto.FLOAT}[wanted]
        assert past.type.tensor_type.elem_type == elem, row


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime_genai") is None, reason="needs onnxruntime-genai")
def test_genai_generates_what_we_generate_with_the_int8_cache(folders):
    prompt, theirs = genai_greedy(folders / "int8", STEPS)
    ours = decode_ids(make_session(folders / "int8/onnx/model.onnx"), prompt, len(theirs))
    assert theirs and ours == theirs
