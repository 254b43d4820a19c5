"""Tiny in-file models: a randomly initialised BERT saved as a Hugging Face directory."""

import string
from pathlib import Path

import pytest
import torch

WORDS = [
    "the",
    "a",
    "an",
    "is",
    "are",
    "of",
    "to",
    "in",
    "and",
    "or",
    "not",
    "for",
    "with",
    "as",
    "def",
    "class",
    "return",
    "import",
    "from",
    "if",
    "else",
    "while",
    "loop",
    "list",
    "dict",
    "string",
    "value",
    "object",
    "module",
    "function",
    "method",
    "python",
    "statement",
]


def write_tiny_bert(path: Path, seed: int = 0) -> Path:
    from transformers import BertConfig, BertModel, BertTokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab += [f"##{c}" for c in string.ascii_lowercase] + WORDS
    path.mkdir(parents=True, exist_ok=True)
    BertTokenizer(vocab={token: i for i, token in enumerate(vocab)}).save_pretrained(path)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=160,  # room for the (8, 128) batch of the memory probe
    )
    BertModel(config).eval().save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path_factory, monkeypatch):
    """No test writes to the user's cache folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    return write_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert")


@pytest.fixture(scope="session")
def eval_text_file(tmp_path_factory) -> Path:
    lines = [" ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 9)) for i in range(1, 25)]
    path = tmp_path_factory.mktemp("text") / "eval.txt"
    path.write_text("\n".join(lines) + "\n")
    return path
