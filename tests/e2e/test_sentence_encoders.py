"""Sentence-transformers folders of other architectures than BERT's, with EmbeddingGemma's table of 262,144 rows and
a tokenizer of one more entry: a bidirectional Gemma 3 with mean Pooling, two Dense layers and Normalize, and an
XLM-R with CLS Pooling, a Dense with Tanh and Normalize. Each is compressed, exported and benched, and the embedding
its folder gives (the bench's, and sentence-transformers' ONNX backend's) is sentence-transformers' own."""

import contextlib
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest

from eval.benchmark import bench
from eval.graph import make_session
from eval.kinds import ENCODER
from tests.conftest import IMAGE_TOKEN, run_cli, write_st_encoder
from texts.tokens import encode_passages, load_tokenizer

PASSAGES = ["the cat sat on the mat", "a dog ran", "numbers 1 2 3 and words", "def return import from the list"]
GRAPH = "onnx/model.onnx"
BEYOND = "beyond the model's table of 262,144 rows"


@pytest.fixture(scope="module", params=["gemma3", "xlm-roberta"])
def exported(request, tmp_path_factory) -> tuple[Path, Path, str]:
    """(the sentence-transformers folder, its export by `compressor export`, what export said on stderr)."""
    from converters.cli import main

    root = tmp_path_factory.mktemp(request.param)
    source = write_st_encoder(root / "st", request.param)
    with contextlib.redirect_stderr(io.StringIO()) as err:
        # the folder by a relative path: the loader resolves it, and the image token is still said once
        assert main(["export", os.path.relpath(source), "--out", str(root / "onnx")]) == 0
    return source, root / "onnx", err.getvalue()


def folder_embeddings(folder: Path, graph: Path, passages: list[str] = PASSAGES) -> np.ndarray:
    """What the bench compares of a graph: the folder's sentence embeddings (its modules after the graph)."""
    batches = encode_passages(load_tokenizer(folder), passages)
    return ENCODER.in_folder(folder).represent(make_session(graph), batches)


def test_the_export_gives_the_folders_own_embedding(exported):
    from sentence_transformers import SentenceTransformer

    source, out, err = exported
    assert err.count(BEYOND) == 1 and IMAGE_TOKEN in err  # the image token, said once
    theirs = SentenceTransformer(str(source), device="cpu").encode(PASSAGES)
    assert np.abs(folder_embeddings(out, out / GRAPH) - theirs).max() < 1e-4
    onnx = SentenceTransformer(str(out), backend="onnx", device="cpu").encode(PASSAGES)  # the modules copied beside
    assert np.abs(onnx - theirs).max() < 1e-4
    modules = [m["path"] for m in json.loads((out / "modules.json").read_text())[1:]]
    assert all((out / path / "config.json").is_file() for path in modules)


def test_compressed_it_is_benched_on_that_embedding(exported, eval_text_file, tmp_path, capsys):
    source, out, _ = exported
    ckpt, small = tmp_path / "ckpt", tmp_path / "small"
    plan = ("--method", "lowrank", "--kind", "plain", "--rank", 4)
    code, _, err = run_cli(capsys, "compress", source, *plan, "--out", ckpt)
    assert code == 0, err
    code, _, err = run_cli(capsys, "export", ckpt, "--out", small)
    assert code == 0, err
    passages, where = ENCODER.passages(eval_text_file, "eval")
    rows = [("original", out / GRAPH), ("lowrank", small / GRAPH)]
    report = bench(rows, out, passages, where, model=str(source), runs=1, settings=(), progress=False)
    original, compressed = (folder_embeddings(folder, folder / GRAPH, passages) for folder in (out, small))
    cosine = float(np.mean(np.sum(original * compressed, axis=1)))
    assert report["variants"][1]["quality"]["cosine_mean"] == pytest.approx(cosine, abs=1e-4)
    assert report["variants"][1]["params"] < report["variants"][0]["params"]


def test_a_text_that_produces_a_token_beyond_the_table_is_refused(exported, eval_text_file, tmp_path, capsys):
    _, out, _ = exported
    lines = eval_text_file.read_text().splitlines()
    bad = tmp_path / "bad.txt"
    bad.write_text("\n".join([*lines[:-1], f"{lines[-1]} {IMAGE_TOKEN}"]) + "\n")
    code, _, err = run_cli(capsys, "bench", out / GRAPH, "--eval-text", bad, "--json", tmp_path / "r.json")
    assert code == 2 and f"produces the token '{IMAGE_TOKEN}' (id 262,144)" in err, err
    assert not (tmp_path / "r.json").exists()
