"""Agreement of a compressed encoder with the original on held-out text: mean cosine of
mean-pooled sentence embeddings, and recall@10 of each passage's nearest neighbours."""

from pathlib import Path

import numpy as np

from eval.graph import make_session

__all__ = ["load_tokenizer", "encode_passages", "sentence_embeddings", "cosine_mean", "recall_at_k"]


def load_tokenizer(tokenizer_dir: str | Path):
    """The tokenizer saved in a model directory, offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


def encode_passages(tokenizer, texts: list[str], max_length: int = 128, batch: int = 32):
    """Tokenised batches [{"input_ids", "attention_mask"}], int64, each padded to its longest."""
    batches = []
    for start in range(0, len(texts), batch):
        enc = tokenizer(
            texts[start : start + batch],
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="np",
        )
        batches.append({k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask")})
    return batches


def sentence_embeddings(onnx_path: str | Path, batches, threads: int = 2) -> np.ndarray:
    """Mean of last_hidden_state over real tokens, L2-normalised: (N, H)."""
    session = make_session(onnx_path, threads=threads)
    out = []
    for feed in batches:
        (hidden,) = session.run(["last_hidden_state"], feed)  # (B, T, H)
        mask = feed["attention_mask"][..., None].astype(np.float32)
        pooled = (hidden * mask).sum(1) / np.maximum(mask.sum(1), 1.0)
        out.append(pooled)
    emb = np.concatenate(out)
    return emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)


def cosine_mean(reference: np.ndarray, other: np.ndarray) -> float:
    """Mean over passages of cos(e_ref, e_other), both rows L2-normalised."""
    return float(np.mean(np.sum(reference * other, axis=1)))


def _neighbours(emb: np.ndarray, k: int) -> np.ndarray:
    sim = emb @ emb.T
    np.fill_diagonal(sim, -np.inf)
    return np.argsort(-sim, axis=1, kind="stable")[:, :k]


def recall_at_k(reference: np.ndarray, other: np.ndarray, k: int = 10) -> float:
    """Mean over passages of |kNN_ref ∩ kNN_other| / k, neighbours by cosine, self excluded."""
    ref, oth = _neighbours(reference, k), _neighbours(other, k)
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ref, oth)]))
