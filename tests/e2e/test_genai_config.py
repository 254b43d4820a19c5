"""ONNX Runtime GenAI's genai_config.json in a fused decoder's folder (files.genai_config): written
beside the fused graph with the names and shapes the graph has, not beside a traced one; where
onnxruntime-genai is installed, its generator runs the folder and decodes greedily what ours does, past a
Gemma 3's window too."""

import importlib.util
import json

import onnx
import pytest

from decoding.sampling import decode_ids
from eval.graph import make_session
from files.genai_config import GENAI_CONFIG
from tests.conftest import genai_greedy, run_cli, write_tiny_lm


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def fused_dir(request, tmp_path_factory):
    """A tiny Llama and a tiny Gemma 3 (windowed layers, heads normed) that the fused decoder writes."""
    return write_tiny_lm(tmp_path_factory.mktemp("genai") / request.param, request.param, hidden=64)


@pytest.mark.parametrize("quantize", [(), ("--quantize", "int4", "--block-size", "16")])
def test_a_fused_decoder_folder_holds_genai_config(fused_dir, tmp_path, capsys, quantize):
    out = tmp_path / "lm"
    code, stdout, err = run_cli(capsys, "export", fused_dir, *quantize, "--out", out)
    assert code == 0, err
    assert f'onnxruntime_genai.Model("{out}")' in stdout
    config = json.loads((out / GENAI_CONFIG).read_text())
    decoder, source = config["model"]["decoder"], json.loads((fused_dir / "config.json").read_text())
    graph = onnx.load(str(out / decoder["filename"])).graph
    inputs, outputs = {i.name for i in graph.input}, {o.name for o in graph.output}
    layers = decoder["num_hidden_layers"]
    assert layers == source["num_hidden_layers"] and decoder["num_key_value_heads"] == source["num_key_value_heads"]
    names = decoder["inputs"]
    assert {names["input_ids"], names["attention_mask"]} | {names["past_key_names"] % i for i in range(layers)} | {
        names["past_value_names"] % i for i in range(layers)
    } == inputs
    names = decoder["outputs"]
    assert {names["logits"]} | {names["present_key_names"] % i for i in range(layers)} | {
        names["present_value_names"] % i for i in range(layers)
    } == outputs
    past = next(i for i in graph.input if i.name == decoder["inputs"]["past_key_names"] % 0)
    assert past.type.tensor_type.shape.dim[3].dim_value == decoder["head_size"]
    assert config["search"]["past_present_share_buffer"] and config["model"]["eos_token_id"] == source["eos_token_id"]


def test_a_traced_decoder_folder_has_none(tiny_gpt2_dir, tmp_path, capsys):
    out = tmp_path / "gpt2"
    code, stdout, err = run_cli(capsys, "export", tiny_gpt2_dir, "--out", out)
    assert code == 0, err
    assert not (out / GENAI_CONFIG).exists() and "onnxruntime_genai" not in stdout


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime_genai") is None, reason="needs onnxruntime-genai")
def test_genai_generates_what_we_generate(fused_dir, tmp_path, capsys):
    out = tmp_path / "lm"
    assert run_cli(capsys, "export", fused_dir, "--out", out)[0] == 0
    prompt, theirs = genai_greedy(out, 12)
    config = json.loads((out / GENAI_CONFIG).read_text())
    session = make_session(out / config["model"]["decoder"]["filename"], threads=1)
    ours = decode_ids(session, prompt, len(theirs), None)
    assert theirs and list(ours)[: len(theirs)] == theirs
