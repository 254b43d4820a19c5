"""The ready model folders of `export` and `run` (files.model_folder): the files the tools look for,
loaded as those tools load them, agreeing with the bench; someone else's folder never written over."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from eval.graph import make_session
from eval.kinds import ENCODER
from tests.conftest import run_cli
from texts.tokens import encode_passages, load_tokenizer

SENTENCE_TRANSFORMERS_FILES = {
    "modules.json": [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ],
    "sentence_bert_config.json": {"max_seq_length": 64, "do_lower_case": False},
    "1_Pooling/config.json": {"word_embedding_dimension": 48, "pooling_mode_mean_tokens": True},
}
PASSAGES = ["the cat sat on the mat", "a dog ran", "numbers 1 2 3 and words"]


@pytest.fixture(scope="module")
def st_model(tiny_bert_dir, tmp_path_factory) -> Path:
    """The tiny BERT as a sentence-transformers model folder (its modules.json, pooling, Normalize)."""
    path = tmp_path_factory.mktemp("st") / "st-bert"
    shutil.copytree(tiny_bert_dir, path)
    for name, content in SENTENCE_TRANSFORMERS_FILES.items():
        (path / name).parent.mkdir(exist_ok=True)
        (path / name).write_text(json.dumps(content))
    return path


def embeddings(folder: Path, graph: str, passages: list[str] = PASSAGES) -> np.ndarray:
    """The bench's embeddings of the passages from the folder's graph and tokenizer."""
    batches = encode_passages(load_tokenizer(folder), passages)
    return ENCODER.represent(make_session(folder / graph), batches)


def test_export_writes_a_folder_the_tools_read(st_model, tmp_path, capsys):
    out = tmp_path / "m"
    code, stdout, err = run_cli(capsys, "export", st_model, "--out", out)
    assert code == 0, err
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    source = {str(p.relative_to(st_model)) for p in st_model.rglob("*") if p.is_file()}
    assert files == sorted(source - {"model.safetensors"} | {"onnx/model.onnx"})  # all but the weights, and the graph
    assert {"modules.json", "1_Pooling/config.json", "sentence_bert_config.json", "tokenizer.json"} <= set(files)
    assert f'SentenceTransformer("{out}", backend="onnx")' in stdout
    from transformers import AutoConfig, AutoTokenizer

    assert AutoConfig.from_pretrained(out).model_type == "bert"  # what Optimum and ST read first
    assert (
        AutoTokenizer.from_pretrained(out)(PASSAGES[0])["input_ids"]
        == load_tokenizer(st_model)(PASSAGES[0])["input_ids"]
    )


@pytest.mark.parametrize(
    ("scheme", "graph", "own"), [("int8", "model_quantized.onnx", False), ("int4", "model_q4.onnx", True)]
)
def test_quantized_graphs_take_the_names_the_tools_look_for(st_model, tmp_path, capsys, scheme, graph, own):
    out = tmp_path / scheme
    code, stdout, err = run_cli(capsys, "export", st_model, "--quantize", scheme, "--block-size", 16, "--out", out)
    assert code == 0, err
    assert [p.name for p in (out / "onnx").iterdir()] == [graph]
    assert f'model_kwargs={{"file_name": "onnx/{graph}"}}' in stdout
    assert ("only ONNX Runtime runs it" in err) == own


def test_a_graph_file_is_still_written_alone(tiny_bert_dir, tmp_path, capsys):
    code, _, err = run_cli(capsys, "export", tiny_bert_dir, "--out", tmp_path / "m.onnx")
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_someone_elses_folder_is_refused_untouched(tiny_bert_dir, tmp_path, capsys):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    code, _, err = run_cli(capsys, "export", tiny_bert_dir, "--out", theirs)
    assert code == 2 and "compressor did not write" in err and str(theirs) in err
    assert [p.name for p in theirs.iterdir()] == ["notes.txt"]


def test_a_folder_of_ours_takes_another_graph(st_model, tmp_path, capsys):
    out = tmp_path / "m"
    for scheme in ([], ["--quantize", "int8"]):
        code, _, err = run_cli(capsys, "export", st_model, *scheme, "--out", out)
        assert code == 0, err
    assert sorted(p.name for p in (out / "onnx").iterdir()) == ["model.onnx", "model_quantized.onnx"]


def test_a_source_without_a_tokenizer_is_said(tiny_bert_dir, tmp_path, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(tiny_bert_dir, bare, ignore=shutil.ignore_patterns("vocab.txt", "tokenizer*", "special*"))
    code, _, err = run_cli(capsys, "export", bare, "--out", tmp_path / "m")
    assert code == 0 and "the folder will hold none" in err, err


def test_run_writes_one_ready_folder_per_row(st_model, eval_text_file, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ("run", st_model, "--method", "lowrank", "--rank", 4, "--eval-text", eval_text_file, "--runs", 2)
    code, _, err = run_cli(capsys, *argv, "--out", out)
    assert code == 0, err
    rows = {v["name"]: v for v in json.loads((out / "report.json").read_text())["variants"]}
    *originals, name = rows
    assert originals == ["original", "original-int8"] and name.startswith("lowrank-r4")
    graphs = {"original": "onnx/model.onnx", "original-int8": "onnx/model_quantized.onnx", name: "onnx/model.onnx"}
    for row, graph in graphs.items():
        assert (out / row / "modules.json").is_file() and (out / row / "config.json").is_file()
        assert (out / row / graph).is_file()
    assert (out / name / "compressed.safetensors").is_file()  # the checkpoint and its graph in one folder
    passages, _ = ENCODER.passages(eval_text_file, "eval")
    original, compressed = (embeddings(out / row, graphs[row], passages) for row in ("original", name))
    cosine = float(np.mean(np.sum(original * compressed, axis=1)))
    assert cosine == pytest.approx(rows[name]["quality"]["cosine_mean"], abs=1e-4)  # the report's 4 digits


def test_a_checkpoint_is_refused_by_sentence_transformers(st_model, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    plan = ("--method", "lowrank", "--kind", "plain", "--rank", 4)
    code, _, err = run_cli(capsys, "compress", st_model, *plan, "--out", ckpt)
    assert code == 0, err
    assert (ckpt / "modules.json").is_file()  # the source's sentence-transformers files travel with it
    from sentence_transformers import SentenceTransformer

    with pytest.raises(OSError, match="load-it-with-converters.load_model"):  # never a random table
        SentenceTransformer(str(ckpt), device="cpu")


@pytest.mark.parametrize(
    ("scheme", "graph"),
    [(None, "model.onnx"), ("int8", "model_quantized.onnx"), ("int4", "model_q4.onnx"), ("int8-w4", "model_q4.onnx")],
)
def test_sentence_transformers_and_optimum_agree_with_the_bench(st_model, tmp_path, capsys, scheme, graph):
    from optimum.onnxruntime import ORTModelForFeatureExtraction
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    out = tmp_path / "m"
    quantize = ["--quantize", scheme] if scheme else []
    assert run_cli(capsys, "export", st_model, *quantize, "--out", out)[0] == 0
    ours = embeddings(out, f"onnx/{graph}")
    for passage, mine in zip(PASSAGES, ours):  # one passage a batch: int8's activation scales are the batch's
        st = SentenceTransformer(str(out), backend="onnx", device="cpu", model_kwargs={"file_name": f"onnx/{graph}"})
        assert float(st.encode([passage])[0] @ mine) == pytest.approx(1.0, abs=1e-4)
        model = ORTModelForFeatureExtraction.from_pretrained(out, subfolder="onnx", file_name=graph)
        tokens = AutoTokenizer.from_pretrained(out)([passage], return_tensors="np")
        hidden = model(**tokens).last_hidden_state[0]
        pooled = hidden.mean(0) / np.linalg.norm(hidden.mean(0))
        assert float(pooled @ mine) == pytest.approx(1.0, abs=1e-4)


def _transformers_js() -> bool:
    node = shutil.which("node")
    probe = [node, "-e", "require.resolve('@huggingface/transformers')"] if node else None
    return probe is not None and subprocess.run(probe, capture_output=True).returncode == 0


@pytest.mark.skipif(not _transformers_js(), reason="needs Node with @huggingface/transformers (NODE_PATH)")
@pytest.mark.parametrize(("scheme", "dtype"), [(None, "fp32"), ("int8", "q8"), ("int8-w4", "q4")])
def test_transformers_js_agrees_with_the_bench(st_model, tmp_path, capsys, scheme, dtype):
    out = tmp_path / "m"
    quantize = ["--quantize", scheme] if scheme else []
    assert run_cli(capsys, "export", st_model, *quantize, "--out", out)[0] == 0
    (tmp_path / "p.json").write_text(json.dumps(PASSAGES))
    script = Path(__file__).with_name("transformers_js_embed.mjs")
    done = subprocess.run(
        ["node", script, out, dtype, tmp_path / "p.json", "128"], capture_output=True, text=True, env=os.environ
    )
    assert done.returncode == 0, done.stderr
    theirs = np.array(json.loads(done.stdout))
    theirs /= np.linalg.norm(theirs, axis=1, keepdims=True)
    graph = next((out / "onnx").iterdir()).relative_to(out)
    assert np.sum(theirs * embeddings(out, str(graph)), axis=1) == pytest.approx(1.0, abs=1e-4)


def test_a_model_compressed_in_place_inside_sentence_transformers_refuses_to_save(st_model, tmp_path):
    from sentence_transformers import SentenceTransformer

    from compressor.errors import CompressorError
    from converters import LowRankConfig, Plan, compress_, load_model

    st = SentenceTransformer(str(st_model), device="cpu")
    compress_(st[0].auto_model, Plan((("linear", LowRankConfig(fit="plain", rank=4)),)), progress=False)
    with pytest.raises(CompressorError, match="converters.save_compressed"):
        st.save(str(tmp_path / "saved"))  # never weights that load back as the dense model with random layers
    assert not (tmp_path / "saved" / "model.safetensors").exists()
    ckpt = tmp_path / "ckpt"
    save = ("compress", st_model, "--method", "lowrank", "--kind", "plain", "--rank", 4, "--out", ckpt)
    from converters.cli import main

    assert main([str(a) for a in save]) == 0
    with pytest.raises(CompressorError, match="converters.load_model"):
        load_model(ckpt)[0].save_pretrained(tmp_path / "again")
