"""Agreement of a compressed model with the original: mean pooling over real tokens, the
encoder's metrics (mean cosine of sentence embeddings, recall@10 of each passage's neighbours) and
a language model's (perplexity, top-1 agreement and mean KL of next-token predictions)."""

from dataclasses import dataclass

import numpy as np

from eval.probe import full_feed, row_blocks, row_chunks

__all__ = [
    "mean_pool",
    "cosine_mean",
    "recall_at_k",
    "KL_TOP",
    "NextTokens",
    "next_tokens",
    "next_token_quality",
]


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


KL_TOP = 256  # the reference's most likely tokens the KL keeps apart; the rest is one outcome


@dataclass(frozen=True)
class NextTokens:
    """A language model's next-token predictions at every real position whose next token is real:
    −log p(true token), the argmax, and log p of the reference's KL_TOP most likely tokens (`top_ids`;
    the model's own for the reference) with the log-probability of all other tokens (`rest`)."""

    nll: np.ndarray  # (N,) float64
    argmax: np.ndarray  # (N,) int64
    top_ids: np.ndarray  # (N, K) int32
    top_logp: np.ndarray  # (N, K) float32
    rest: np.ndarray  # (N,) float64


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def next_tokens(session, output: str, batches, reference: NextTokens | None = None) -> NextTokens:
    """The predictions of an ONNX language model (`output`: its logits, (B, T, V)) on `batches`: at
    position t < T−1 of a row where tokens t and t+1 are both real, p(· | tokens ≤ t) against token t+1.
    Kept per position: the reference's top tokens when `reference` is given, else the model's own."""
    parts: list[tuple] = []
    done = 0
    for feed in (part for whole in batches for part in row_chunks(session, whole)):
        (logits,) = session.run([output], full_feed(session, feed))  # (B, T, V)
        ids, mask = feed["input_ids"], feed["attention_mask"].astype(bool)
        real = mask[:, :-1] & mask[:, 1:]  # (B, T−1)
        for chosen, target in row_blocks(logits[:, :-1][real], ids[:, 1:][real]):
            logp = _log_softmax(chosen.astype(np.float32))  # (n, V)
            rows = np.arange(len(logp))
            if reference is None:
                k = min(KL_TOP, logp.shape[1])
                top = np.argpartition(-logp, k - 1, axis=1)[:, :k].astype(np.int32)
            else:
                top = reference.top_ids[done : done + len(logp)]
            top_logp = np.take_along_axis(logp, top, axis=1)
            kept = np.exp(top_logp.astype(np.float64)).sum(axis=1)
            rest = np.log(np.clip(1.0 - kept, 1e-30, None))
            parts.append((-logp[rows, target].astype(np.float64), logp.argmax(axis=1), top, top_logp, rest))
            done += len(logp)
    if reference is not None and done != len(reference.nll):
        raise ValueError(f"the reference made {len(reference.nll)} predictions on these batches, this model {done}")
    return NextTokens(*(np.concatenate(column) for column in zip(*parts)))


def next_token_quality(reference: NextTokens, other: NextTokens) -> dict[str, float]:
    """perplexity = exp(mean −log q(true token)); top1_agreement = the share of positions where the
    two argmaxes agree; kl_mean = mean KL(p ‖ q) over the reference's top tokens and the rest as one
    outcome (exact when the top holds the whole vocabulary, a lower bound of the full KL otherwise)."""
    p_top = np.exp(reference.top_logp.astype(np.float64))
    kl = (p_top * (reference.top_logp - other.top_logp.astype(np.float64))).sum(axis=1)
    p_rest = np.exp(reference.rest)
    kl += np.where(p_rest > 1e-12, p_rest * (reference.rest - other.rest), 0.0)
    return {
        "perplexity": float(np.exp(other.nll.mean())),
        "top1_agreement": float((other.argmax == reference.argmax).mean()),
        "kl_mean": float(max(kl.mean(), 0.0)),
    }
