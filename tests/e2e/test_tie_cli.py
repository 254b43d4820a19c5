"""compressor tie on tiny LMs: an untied model comes back tied and fine-tuned, its checkpoint holds
one table and exports with parity; a tied one gets a new score; bad input is one sentence, exit
status 2, nothing written."""

import pytest
from safetensors import safe_open

from compressor.tied_logits import TiedLogits
from converters.checkpoint import CHECKPOINT_WEIGHTS, load_model, read_meta
from tests.conftest import run_cli, write_tiny_lm


@pytest.fixture(scope="module")
def untied_dir(tmp_path_factory):
    return write_tiny_lm(tmp_path_factory.mktemp("untied") / "gpt2", "gpt2", tied=False, seed=2)


def test_tie_ties_finetunes_and_saves_one_table(untied_dir, lm_text, tmp_path, capsys):
    out = tmp_path / "tied"
    code, _, err = run_cli(capsys, "tie", untied_dir, "--init", "mean", "--steps", 3, "--data", lm_text, "--out", out)
    assert code == 0, err
    assert "fine-tune on" in err and "3 steps" in err
    model, _ = load_model(out)
    assert isinstance(model.get_output_embeddings(), TiedLogits)
    assert read_meta(out)["plan"]["tie"] == {"init": "mean", "score": "dot"}
    with safe_open(str(out / CHECKPOINT_WEIGHTS), "pt") as f:
        names = list(f.keys())  # noqa: SIM118 (a safetensors handle is no dict)
        tables = [k for k in names if f.get_slice(k).get_shape()[0] == model.config.vocab_size]
    assert tables == ["transformer.wte.weight"]
    code, _, err = run_cli(capsys, "export", out, "--out", tmp_path / "tied.onnx")
    assert code == 0, err


def test_tie_rescores_a_tied_model(tiny_gpt2_dir, lm_text, tmp_path, capsys):
    out = tmp_path / "cosine"
    code, _, err = run_cli(capsys, "tie", tiny_gpt2_dir, "--score", "cosine", "--steps", 0, "--out", out)
    assert code == 0, err
    assert load_model(out)[0].get_output_embeddings().score == "cosine"


@pytest.mark.parametrize(
    "model, extra, says",
    [
        ("bert", [], "no output projection to tie"),
        ("untied", ["--score", "euclid"], "invalid choice"),
        ("untied", ["--temperature", "-1"], "temperature must be positive"),
    ],
)
def test_bad_input_is_one_sentence_and_writes_nothing(tiny_bert_dir, untied_dir, tmp_path, capsys, model, extra, says):
    out = tmp_path / "out"
    path = {"bert": tiny_bert_dir, "untied": untied_dir}[model]
    try:
        code, _, err = run_cli(capsys, "tie", path, *extra, "--out", out)
    except SystemExit as e:  # argparse's own refusal
        code, err = e.code, capsys.readouterr().err
    assert code == 2 and says in err, err
    assert not out.exists()
