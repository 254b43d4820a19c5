"""The tokenizer saved beside a model, offline, and tokenised batches of passages: what the
calibration, the fine-tune, the bench and the quality metrics all feed a model."""

from pathlib import Path

import numpy as np

__all__ = ["load_tokenizer", "encode_passages"]


def load_tokenizer(tokenizer_dir: str | Path):
    """The tokenizer saved in a model directory, offline; one without a padding token (GPT-2's,
    Llama's) pads with its end-of-text token, which the attention mask hides."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def encode_passages(tokenizer, texts: list[str], max_length: int = 128, batch: int = 32, tensors: str = "np"):
    """Tokenised batches [{"input_ids", "attention_mask"}], int64, each padded to its longest;
    numpy arrays, or torch tensors with tensors="pt"."""
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
    return batches


_FEEDS = ("input_ids", "attention_mask")
