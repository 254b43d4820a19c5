"""The sentence embedding a sentence-transformers folder computes from its Transformer's last_hidden_state
(files.sentence_modules): the Pooling's modes over the real tokens, concatenated; each Dense layer, act(W e + b);
then the Normalize, e / ‖e‖. Numpy, as sentence-transformers computes them in PyTorch (right padding)."""

import numpy as np

from compressor.errors import CompressorError
from eval.quality import mean_pool
from files.sentence_modules import SentenceModules

__all__ = ["pool", "sentence_embedding"]


def pool(hidden: np.ndarray, mask: np.ndarray, mode: str) -> np.ndarray:
    """One Pooling mode of `hidden` (B, T, H) over the real tokens of the right-padded `mask` (B, T): (B, H)."""
    m = mask[..., None].astype(hidden.dtype)  # (B, T, 1)
    if mode == "mean":
        return mean_pool(hidden, mask)
    if mode == "mean_sqrt_len_tokens":
        return (hidden * m).sum(1) / np.sqrt(np.maximum(m.sum(1), 1e-9))
    if mode == "weightedmean":  # the i-th real token weighs i
        w = m * np.arange(1, hidden.shape[1] + 1, dtype=hidden.dtype)[None, :, None]
        return (hidden * w).sum(1) / np.maximum(w.sum(1), 1e-9)
    if mode == "max":
        return np.where(m > 0, hidden, -np.inf).max(1)
    rows = np.arange(len(hidden))
    if mode == "cls":  # the first real token
        return hidden[rows, mask.argmax(1)]
    last = mask.shape[1] - 1 - mask[:, ::-1].argmax(1)  # lasttoken: the last real token
    return hidden[rows, last]


def sentence_embedding(hidden: np.ndarray, mask: np.ndarray, modules: SentenceModules) -> np.ndarray:
    """The folder's embedding of each row (B, D) from the graph's last_hidden_state (B, T, H)."""
    width = modules.dense[0].weight.shape[1] if modules.dense else None
    emb = np.concatenate([pool(hidden, mask, mode) for mode in modules.pooling], axis=1)
    if width is not None and emb.shape[1] != width:
        raise CompressorError(
            f"the folder's first Dense layer reads {width} numbers and its pooling gives {emb.shape[1]}: the graph's "
            "output is not the Transformer these modules follow"
        )
    for dense in modules.dense:
        emb = emb @ dense.weight.T + (0 if dense.bias is None else dense.bias)
        emb = np.tanh(emb) if dense.tanh else emb
    if modules.normalize:
        emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    return emb
