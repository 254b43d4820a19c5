"""What a fine-tune reads: its text cut into windows of tokens, drawn uniformly or by the rarity of their
tokens, padded into batches, and windows of tokens drawn from a general-English prior."""

import torch
from torch import Tensor

from compressor.errors import CompressorError
from texts.tokens import check_ids

__all__ = ["windows", "pad", "batches", "window_weights", "synthetic_windows"]


def windows(tokenizer, texts: list[str], length: int) -> list[list[int]]:
    """Each passage cut into consecutive windows of at most `length` tokens, each with its special
    tokens ([CLS] … [SEP]): the whole text is seen, not only each passage's start."""
    enc = tokenizer(texts, truncation=True, max_length=length, return_overflowing_tokens=True, stride=0)
    check_ids(tokenizer, torch.as_tensor([i for window in enc["input_ids"] for i in window], dtype=torch.long))
    return list(enc["input_ids"])


def pad(tokenizer, windows: list[list[int]]) -> tuple[Tensor, Tensor]:
    enc = tokenizer.pad({"input_ids": windows}, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def batches(tokenizer, texts: list[str], cfg) -> list[tuple[Tensor, Tensor]]:
    """Windows of at most cfg.max_length tokens, sorted by length and cut into batches of cfg.batch_size,
    each padded to its longest."""
    cut = sorted(windows(tokenizer, texts, cfg.max_length), key=len)
    return [pad(tokenizer, cut[i : i + cfg.batch_size]) for i in range(0, len(cut), cfg.batch_size)]


def window_weights(windows: list[list[int]], rare_share: float) -> Tensor:
    """The probability of drawing each window: (1 − ρ)/N + ρ r_i / Σ r, r_i = Σ over the distinct
    tokens t of window i of 1 / count(t), count over all windows: every token type weighs about alike."""
    if rare_share == 0:
        return torch.full((len(windows),), 1 / len(windows), dtype=torch.float64)
    ids = [torch.as_tensor(sorted(set(w)), dtype=torch.long) for w in windows]
    counts = torch.bincount(torch.cat([torch.as_tensor(w, dtype=torch.long) for w in windows])).to(torch.float64)
    rarity = torch.stack([(1.0 / counts[i]).sum() for i in ids])
    return (1 - rare_share) / len(windows) + rare_share * rarity / rarity.sum()


def _special_ends(tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a passage's own ([CLS] and [SEP] for BERT)."""
    whole = tokenizer("word")["input_ids"]
    body = tokenizer("word", add_special_tokens=False)["input_ids"]
    at = next((i for i in range(len(whole) - len(body) + 1) if whole[i : i + len(body)] == body), None)
    if at is None:
        raise CompressorError(
            "the tokenizer splits a passage's own tokens around its special ones: no synthetic windows"
        )
    return whole[:at], whole[at + len(body) :]


def synthetic_windows(tokenizer, prior: Tensor, count: int, length: int, generator: torch.Generator) -> list[list[int]]:
    """`count` windows of `length` tokens, the tokenizer's special tokens at their ends, whose other
    tokens are drawn independently from prior^½ (flattened towards the rare tokens), special tokens left out."""
    weights = prior.clone().sqrt()
    weights[[i for i in tokenizer.all_special_ids if i < len(weights)]] = 0  # (none beyond the table is drawn)
    before, after = _special_ends(tokenizer)
    inner = length - len(before) - len(after)
    draws = torch.multinomial(weights, count * inner, replacement=True, generator=generator).view(count, inner)
    return [before + row.tolist() + after for row in draws]
