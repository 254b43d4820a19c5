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
    """(N, k): for each row i the columns j by emb_i·emb_j descending, ties to the lower j, j = i last (−inf);
    `block` rows × N at a time (default ~64 MB): the k-th value as threshold, candidates lexsorted."""
    n, k = len(emb), min(k, len(emb))
    block = block or max(1, BLOCK_BYTES // max(1, n * emb.itemsize))
    parts = -(-n // block)
    stops = [n * p // parts for p in range(parts + 1)]  # equal blocks: no 1-row tail, which BLAS sums another way
    out = np.empty((n, k), dtype=np.intp)
    for start, stop in zip(stops, stops[1:]):
        neg = emb[start:stop] @ emb.T
        np.negative(neg, out=neg)
        rows = np.arange(stop - start)
        neg[rows, start + rows] = np.inf
        kth = np.partition(neg, k - 1, axis=1)[:, k - 1 : k]
        r, c = np.nonzero(~(neg > kth))  # neg <= kth; NaN sorts last, as in argsort
        order = np.lexsort((c, neg[r, c], r))
        r, c = r[order], c[order]
        out[start:stop] = c[np.searchsorted(r, rows)[:, None] + np.arange(k)]
    return out


def recall_at_k(reference: np.ndarray, other: np.ndarray, k: int = 10) -> float:
    """Mean over passages of |kNN_ref ∩ kNN_other| / k, neighbours by cosine, self excluded."""
    ref, oth = _neighbours(reference, k), _neighbours(other, k)
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ref, oth)]))
