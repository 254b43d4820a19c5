"""tools/train_lm.py end to end: a tiny GPT-2 trained tied and untied loads offline as a Hugging Face
model and tokenizer, keeps (or not) one table, scores the held-out text as it said, and bad input is
refused in one sentence with exit status 2, before any work."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from texts.corpus import lm_passages
from tools import lstm_lm, train_lm

RUNS = {"tied": [], "untied": ["--untied"], "lstm": ["--arch", "lstm", "--untied"], "lstm-tied": ["--arch", "lstm"]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """Tiny GPT-2 and LSTM models trained tied and untied (20 steps on 300 passages each)."""
    root = tmp_path_factory.mktemp("lm")
    with pytest.MonkeyPatch.context() as patch:  # the default text's cache goes to tmp, as in conftest
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        for name, extra in RUNS.items():
            assert train_lm.main(["--tiny", "--out", str(root / name), *extra]) == 0
    return {name: root / name for name in RUNS}


def load(path: Path):
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if (path / lstm_lm.CONFIG_FILE).is_file():
        return lstm_lm.load(path), tokenizer
    return AutoModelForCausalLM.from_pretrained(path, local_files_only=True), tokenizer


def safetensors_keys(path: Path) -> set[str]:
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return set(f.keys())


def test_tied_model_keeps_one_table(trained):
    model, _ = load(trained["tied"])
    assert type(model).__name__ == "GPT2LMHeadModel" and model.config.tie_word_embeddings
    wte, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert wte.data_ptr() == head.data_ptr()
    assert "lm_head.weight" not in safetensors_keys(trained["tied"])
    record = json.loads((trained["tied"] / "train_lm.json").read_text())
    assert record["tied"] and record["table_parameters"] == 512 * 32 == wte.numel()
    assert record["parameters"] == model.num_parameters()


def test_untied_model_keeps_two_trained_tables(trained):
    model, _ = load(trained["untied"])
    assert not model.config.tie_word_embeddings
    wte, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert wte.data_ptr() != head.data_ptr()
    assert {"transformer.wte.weight", "lm_head.weight"} <= safetensors_keys(trained["untied"])
    assert not torch.equal(wte, head)
    record = json.loads((trained["untied"] / "train_lm.json").read_text())
    assert not record["tied"] and record["table_parameters"] == 2 * 512 * 32


def test_lstm_models_are_plain_modules_tied_once_or_untied(trained):
    tied, _ = load(trained["lstm-tied"])
    untied, _ = load(trained["lstm"])
    assert type(tied).__name__ == "LSTMLM" and tied.cfg.tied and not untied.cfg.tied
    assert tied.decoder.weight is tied.embedding.weight
    assert untied.decoder.weight.data_ptr() != untied.embedding.weight.data_ptr()
    assert len([k for k in safetensors_keys(trained["lstm-tied"]) if k.endswith("weight") and "lstm" not in k]) == 1
    assert {"embedding.weight", "decoder.weight"} <= safetensors_keys(trained["lstm"])
    record = json.loads((trained["lstm"] / "train_lm.json").read_text())
    assert record["table_parameters"] == 2 * 512 * 32 and record["options"]["arch"] == "lstm"


@pytest.mark.parametrize("name", RUNS)
def test_training_learned_and_the_saved_model_scores_as_reported(trained, name):
    """The loss fell, the model beats a uniform guess, and the reloaded model (so every saved tensor,
    the untied output table included) gives back the perplexity the script reported."""
    record = json.loads((trained[name] / "train_lm.json").read_text())
    assert record["steps"] == 20 and record["final_train_loss"] < record["first_loss"]
    assert 1 < record["eval_perplexity"] < record["vocab_size"] == 512
    model, tokenizer = load(trained[name])
    ppl, tokens = train_lm.perplexity(model, tokenizer, lm_passages("eval")[:16])
    assert tokens == record["eval_tokens"]
    assert math.isclose(ppl, record["eval_perplexity"], rel_tol=1e-3)


def test_tokenizer_pads_and_adds_nothing(trained):
    model, tokenizer = load(trained["tied"])
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == tokenizer.bos_token_id == eot
    assert model.config.pad_token_id == model.config.eos_token_id == eot
    assert len(tokenizer) == model.config.vocab_size == 512
    text = "Return the value of the named attribute of object.\n  Spaces, é and 😀 survive."
    ids = tokenizer(text)["input_ids"]
    assert eot not in ids and tokenizer.decode(ids) == text  # byte level: nothing is unknown, nothing added
    batch = tokenizer(["def f():", text, "x " * 500], padding=True, truncation=True, max_length=128)
    assert [len(i) for i in batch["input_ids"]] == [128] * 3
    assert batch["input_ids"][0][-1] == eot and batch["attention_mask"][0][-1] == 0
    assert all(batch["attention_mask"][2])


def test_force_replaces_the_output_whole(trained, tmp_path):
    out = tmp_path / "lm"
    assert train_lm.main(["--tiny", "--steps", "2", "--eval-passages", "0", "--out", str(out)]) == 0
    (out / "stale.txt").write_text("from before")
    assert train_lm.main(["--tiny", "--steps", "3", "--eval-passages", "0", "--force", "--out", str(out)]) == 0
    assert json.loads((out / "train_lm.json").read_text())["steps"] == 3
    assert not (out / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["lm"]  # no temporary sibling left


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_an_existing_output_is_refused_and_left_alone(trained, capsys):
    before = snapshot(trained["tied"])
    assert train_lm.main(["--tiny", "--out", str(trained["tied"])]) == 2
    err = capsys.readouterr().err
    assert "exists" in err and "--force" in err and len(err.strip().splitlines()) == 1
    assert snapshot(trained["tied"]) == before


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--n-embd", "30", "--n-head", "4"], "divisible"),
        (["--vocab", "0"], "--vocab must be a positive integer"),
        (["--vocab", "100"], "at least 257"),
        (["--n-layer", "-1"], "--n-layer must be a positive integer"),
        (["--steps", "0"], "--steps must be a positive integer"),
        (["--minutes", "0"], "--minutes must be a positive number"),
        (["--dropout", "1"], "--dropout must be in [0, 1)"),
        (["--block", "300"], "--n-positions must be at least --block"),
        (["--n-positions", "64", "--block", "32"], "at least --block and 128"),
    ],
)
def test_bad_options_are_refused_before_any_work(argv, says, tmp_path, capsys):
    out = tmp_path / "lm"
    assert train_lm.main(["--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_missing_out_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        train_lm.main(["--tiny"])
    assert e.value.code == 2 and "--out" in capsys.readouterr().err
