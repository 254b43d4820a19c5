"""The sentence embedding of a sentence-transformers folder's modules (files.sentence_modules, eval.embedding) against
sentence-transformers' own modules, and the folders the toolkit refuses, each in one sentence that names the module."""

import json
import struct

import numpy as np
import pytest
import torch

from compressor.errors import CompressorError
from eval.embedding import pool, sentence_embedding
from files.sentence_modules import POOLING_MODES, sentence_modules

TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}


def _batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Hidden states (3, 6, 8) and a right-padded mask of 6, 4 and 1 real tokens."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(6)[None, :] < np.array([6, 4, 1])[:, None]).astype(np.int64)
    return rng.standard_normal((3, 6, 8)).astype(np.float32), mask


@pytest.mark.parametrize("mode", POOLING_MODES)
def test_each_pooling_mode_is_sentence_transformers(mode):
    from sentence_transformers.models import Pooling

    hidden, mask = _batch()
    theirs = Pooling(8, mode)({"token_embeddings": torch.from_numpy(hidden), "attention_mask": torch.from_numpy(mask)})
    np.testing.assert_allclose(pool(hidden, mask, mode), theirs["sentence_embedding"].numpy(), atol=1e-5)


def _write(folder, modules: list[dict], files: dict) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "modules.json").write_text(json.dumps([TRANSFORMER, *modules]))
    for name, content in files.items():
        (folder / name).parent.mkdir(exist_ok=True)
        if isinstance(content, bytes):
            (folder / name).write_bytes(content)
        else:
            (folder / name).write_text(json.dumps(content))


def _module(idx: int, kind: str, path: str = "") -> dict:
    return {
        "idx": idx,
        "name": str(idx),
        "path": path or f"{idx}_{kind}",
        "type": f"sentence_transformers.models.{kind}",
    }


def _bf16_safetensors(tensors: dict[str, torch.Tensor]) -> bytes:
    """A safetensors file of bfloat16 tensors, written by hand (numpy has no bfloat16)."""
    header, data, offset = {}, b"", 0
    for name, tensor in tensors.items():
        raw = tensor.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensor.shape), "data_offsets": [offset, offset + len(raw)]}
        data, offset = data + raw, offset + len(raw)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def test_pooling_dense_and_normalize_are_sentence_transformers(tmp_path):
    """Two poolings concatenated, a Dense with Tanh and a bias stored in bfloat16, one without: the folder's
    embedding as sentence-transformers computes it."""
    from sentence_transformers.models import Dense, Normalize, Pooling

    torch.manual_seed(0)
    first, second = Dense(16, 12), Dense(12, 5, bias=False, activation_function=None)
    with torch.no_grad():  # weights bfloat16 holds exactly, as the file does
        for p in (*first.parameters(), *second.parameters()):
            p.copy_(p.to(torch.bfloat16).float())
    for name, dense in (("2_Dense", first), ("3_Dense", second)):
        (tmp_path / "st" / name).mkdir(parents=True)
        dense.save(str(tmp_path / "st" / name))
    (tmp_path / "st" / "2_Dense" / "model.safetensors").write_bytes(_bf16_safetensors(dict(first.state_dict())))
    pooling = {"embedding_dimension": 8, "pooling_mode": ["mean", "max"]}
    modules = [_module(1, "Pooling"), _module(2, "Dense"), _module(3, "Dense"), _module(4, "Normalize")]
    _write(tmp_path / "st", modules, {"1_Pooling/config.json": pooling})
    hidden, mask = _batch(1)
    features = {"token_embeddings": torch.from_numpy(hidden), "attention_mask": torch.from_numpy(mask)}
    for module in (Pooling(8, ("mean", "max")), first, second, Normalize()):
        features = module(features)
    ours = sentence_embedding(hidden, mask, sentence_modules(tmp_path / "st"))
    np.testing.assert_allclose(ours, features["sentence_embedding"].detach().numpy(), atol=1e-5)


@pytest.mark.parametrize(
    ("modules", "files", "named"),
    [
        ([_module(1, "Pooling"), _module(2, "LSTM")], {}, "module 2 (sentence_transformers.models.LSTM)"),
        ([_module(1, "Normalize"), _module(2, "Pooling")], {}, "module 1 (sentence_transformers.models.Normalize)"),
        (
            [{"idx": 1, "name": "mine", "path": "1_Mine", "type": "my_code.Pooling"}],
            {},
            "module mine (my_code.Pooling)",
        ),
        ([], {}, "names no Pooling module"),
        (
            [_module(1, "Pooling"), _module(2, "Dense")],
            {"2_Dense/config.json": {"in_features": 8, "out_features": 4, "activation_function": "torch.nn.ReLU"}},
            "the activation torch.nn.ReLU",
        ),
        (
            [_module(1, "Pooling"), _module(2, "Dense")],
            {"2_Dense/config.json": {"in_features": 8, "out_features": 4}, "2_Dense/pytorch_model.bin": b"\x80"},
            "from safetensors only",
        ),
        ([_module(1, "Pooling", "1_Pooling")], {"1_Pooling/config.json": {"pooling_mode": "median"}}, "'median'"),
    ],
)
def test_a_module_the_toolkit_cannot_export_is_named(tmp_path, modules, files, named):
    _write(tmp_path / "st", modules, files)
    with pytest.raises(CompressorError, match="cannot export|names no|safetensors only|modes") as caught:
        sentence_modules(tmp_path / "st")
    assert named in str(caught.value)


def test_export_refuses_such_a_folder_before_any_work(tiny_bert_dir, tmp_path, capsys):
    import shutil

    from tests.conftest import run_cli

    folder = tmp_path / "st"
    shutil.copytree(tiny_bert_dir, folder)
    _write(folder, [_module(1, "Pooling"), _module(2, "LSTM")], {})
    code, _, err = run_cli(capsys, "export", folder, "--out", tmp_path / "m")
    assert code == 2 and "names module 2 (sentence_transformers.models.LSTM)" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "m").exists()
