"""The tokenizer saved beside a model, offline, and tokenised batches of passages: what the
calibration, the fine-tune, the bench and the quality metrics all feed a model. A tokenizer may hold entries
beyond its model's table (EmbeddingGemma's image token): a text that produces one is refused in one sentence."""

import functools
import json
from pathlib import Path

import numpy as np

from compressor.errors import CompressorError

__all__ = ["load_tokenizer", "encode_passages", "table_rows", "check_ids"]


def load_tokenizer(tokenizer_dir: str | Path):
    """The tokenizer saved in a model directory, offline, padding on the right; one without a padding
    token (GPT-2's, Llama's) pads with its end-of-text token, which the attention mask hides. Read once per folder
    (while its files stay as they are): the steps of a run share it."""
    path = Path(tokenizer_dir).absolute()
    files = sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else []
    return _tokenizer(str(path), tuple((f.name, f.stat().st_mtime_ns) for f in files))


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str, files: tuple) -> object:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"  # a fused decoder's attention counts each row's tokens from the left
    return tokenizer


@functools.lru_cache(maxsize=8)
def table_rows(folder: str) -> int | None:
    """The rows of the word table of the model whose folder holds the tokenizer (config.json's vocab_size), None
    where the folder says none."""
    try:
        rows = json.loads((Path(folder) / "config.json").read_text()).get("vocab_size") if folder else None
    except (OSError, ValueError, AttributeError):
        return None
    return rows if isinstance(rows, int) else None


def check_ids(tokenizer, ids) -> None:
    """One sentence, naming it, for a token in `ids` (an array or tensor) beyond the table of the model whose folder
    the tokenizer was loaded from (table_rows)."""
    rows = table_rows(str(getattr(tokenizer, "name_or_path", "") or ""))
    beyond = ids[ids >= rows] if rows is not None else ids[:0]
    if len(beyond):
        token = int(beyond[0])
        raise CompressorError(
            f"the text produces the token {tokenizer.convert_ids_to_tokens(token)!r} (id {token:,}), which the "
            f"model's table of {rows:,} rows lacks: leave it out of the text"
        )


def encode_passages(tokenizer, texts: list[str], max_length: int = 128, batch: int = 32, tensors: str = "np"):
    """Tokenised batches [{"input_ids", "attention_mask"}], int64, each padded to its longest;
    numpy arrays, or torch tensors with tensors="pt"; refused in one sentence where a text produces a token beyond
    the table of the model the tokenizer was saved with (check_ids)."""
    batches = []
    for start in range(0, len(texts), batch):
        enc = tokenizer(
            texts[start : start + batch],
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors=tensors,
        )
        batches.append({k: enc[k] if tensors == "pt" else enc[k].astype(np.int64) for k in _FEEDS})
        check_ids(tokenizer, batches[-1]["input_ids"])
    return batches


_FEEDS = ("input_ids", "attention_mask")
