"""Agreement of a compressed model with the original, and the helpers every package shares to
get there: the tokenizer, tokenised batches of passages, mean pooling over real tokens, the
encoder's metrics (mean cosine of sentence embeddings, recall@10 of each passage's neighbours)."""

from pathlib import Path

import numpy as np

__all__ = ["load_tokenizer", "encode_passages", "mean_pool", "cosine_mean", "recall_at_k"]


def load_tokenizer(tokenizer_dir: str | Path):
    """The tokenizer saved in a model directory, offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


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


def mean_pool(hidden, mask):
    """Mean of `hidden` (B, T, H) over the real tokens of `mask` (B, T); numpy arrays or torch tensors."""
    m = mask[..., None].astype(hidden.dtype) if isinstance(hidden, np.ndarray) else mask[..., None].to(hidden.dtype)
    count = m.sum(1)
    return (hidden * m).sum(1) / (count + (count == 0))  # an all-padding row pools to 0, not NaN


def cosine_mean(reference: np.ndarray, other: np.ndarray) -> float:
    """Mean over passages of cos(e_ref, e_other), both rows L2-normalised."""
    return float(np.mean(np.sum(reference * other, axis=1)))


BLOCK_BYTES = 64 * 2**20  # similarities held at once: one block of rows against every passage


def _neighbours(emb: np.ndarray, k: int, block: int | None = None) -> np.ndarray:
    """Each row's k most similar other rows (similarity emb·embᵀ, descending; ties to the lower
    index), found `block` rows at a time: memory O(block·N), not O(N²). Per block, every column at
    or above the row's k-th largest similarity is a candidate, and candidates are ordered by
    (−similarity, column)."""
    n = len(emb)
    block = block or max(1, BLOCK_BYTES // max(1, n * emb.itemsize))
    out = np.empty((n, k), dtype=np.int64)
    for start in range(0, n, block):
        sim = emb[start : start + block] @ emb.T  # (b, N)
        rows = np.arange(len(sim))
        sim[rows, rows + start] = -np.inf  # not one's own neighbour
        kth = -np.partition(-sim, k - 1, axis=1)[:, k - 1 : k]  # the k-th largest per row
        r, c = np.nonzero(sim >= kth)  # candidates, ties at the k-th value included
        order = np.lexsort((c, -sim[r, c], r))
        r, c = r[order], c[order]
        first = np.searchsorted(r, rows)  # where each row's candidates begin
        out[start : start + len(sim)] = c[first[:, None] + np.arange(k)]
    return out


def recall_at_k(reference: np.ndarray, other: np.ndarray, k: int = 10) -> float:
    """Mean over passages of |kNN_ref ∩ kNN_other| / k, neighbours by cosine, self excluded."""
    ref, oth = _neighbours(reference, k), _neighbours(other, k)
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ref, oth)]))
