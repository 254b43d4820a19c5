import json
import re

import pytest
import torch

import converters.checkpoint as checkpoint
from compressor.errors import CompressorError, ShapeError
from compressor.tt_embedding import TTEmbedding
from converters.checkpoint import CHECKPOINT_WEIGHTS, load_model, save_compressed
from converters.compress import compress_
from converters.methods.tt import TTConfig
from converters.plan import Plan

PLAN = Plan((("embeddings", TTConfig(rank=6, order="pca")),))


@pytest.fixture
def compressed(tiny_bert_dir, tmp_path):
    model, source = load_model(tiny_bert_dir)
    report = compress_(model, PLAN, progress=False)
    return model, save_compressed(model, PLAN, report, source, tmp_path / "ckpt")


def test_save_then_load_is_bit_exact(compressed):
    model, path = compressed
    loaded, _ = load_model(path)
    assert isinstance(loaded.get_input_embeddings(), TTEmbedding)
    theirs = loaded.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name
    ids = torch.randint(0, 100, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(ids).last_hidden_state, loaded(ids).last_hidden_state)


def test_checkpoint_holds_plan_and_tokenizer(compressed):
    _, path = compressed
    names = {p.name for p in path.iterdir()}
    assert {
        "compressor.json",
        CHECKPOINT_WEIGHTS,
        "config.json",
        "tokenizer_config.json",
        "tokenizer.json",
    } <= names


def test_interrupted_save_leaves_nothing_under_the_final_name(tiny_bert_dir, tmp_path, monkeypatch):
    model, source = load_model(tiny_bert_dir)
    report = compress_(model, PLAN, progress=False)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save_safetensors", crash)
    with pytest.raises(KeyboardInterrupt):
        save_compressed(model, PLAN, report, source, tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


def test_weights_that_do_not_fit_raise(compressed):
    _, path = compressed
    from safetensors.torch import load_file, save_file

    weights = load_file(path / CHECKPOINT_WEIGHTS)
    key = next(k for k in weights if "cores.0" in k)
    weights[key] = torch.zeros(3, 3)
    save_file(weights, path / CHECKPOINT_WEIGHTS)
    with pytest.raises(ShapeError, match="do not fit"):
        load_model(path)


@pytest.mark.parametrize("make", ["missing", "empty_dir", "file"])
def test_a_path_that_is_not_a_model_raises(tmp_path, make):
    path = tmp_path / "x"
    if make == "empty_dir":
        path.mkdir()
    elif make == "file":
        path.write_text("hello")
    with pytest.raises(CompressorError, match="does not exist|not a model directory"):
        load_model(path)


def test_transformers_refuses_a_compressed_checkpoint_instead_of_a_random_table(compressed):
    # AutoModel would build the dense source model and draw its missing word table at random
    from transformers import AutoModel

    _, path = compressed
    with pytest.raises(OSError, match=re.escape("load-it-with-converters.load_model")):
        AutoModel.from_pretrained(path)


def test_a_version_1_checkpoint_still_loads(compressed):
    model, path = compressed
    meta = json.loads((path / "compressor.json").read_text())
    (path / "compressor.json").write_text(json.dumps({**meta, "version": 1}))
    (path / CHECKPOINT_WEIGHTS).rename(path / "model.safetensors")
    loaded, _ = load_model(path)
    ids = torch.randint(0, 100, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(ids).last_hidden_state, loaded(ids).last_hidden_state)
