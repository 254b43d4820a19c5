"""A token at a time: each new token the argmax of the logits (greedy), or a draw from softmax(logits /
temperature) over the top k with a seeded generator."""

import numpy as np

from decoding.decoders import open_decoder

__all__ = ["choose", "decode_ids"]


def choose(logits: np.ndarray, rng: np.random.Generator | None, temperature: float, top_k: int) -> int:
    """argmax (rng None), else a draw from softmax(logits / temperature) over the top_k."""
    if rng is None:
        return int(np.argmax(logits))
    top = np.argpartition(-logits, min(top_k, len(logits)) - 1)[:top_k]
    z = logits[top].astype(np.float64) / temperature
    p = np.exp(z - z.max())
    return int(rng.choice(top, p=p / p.sum()))


def decode_ids(
    session,
    prompt: np.ndarray,
    max_new_tokens: int,
    eos: int | None = None,
    sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 50,
    seed: int = 0,
) -> list[int]:
    """The new token ids after `prompt` (1-D ids): greedy, or sampled with a seeded generator; stops
    after `eos`."""
    rng = np.random.default_rng(seed) if sample else None
    decoder = open_decoder(session)
    logits = decoder.start(prompt)
    new: list[int] = []
    while len(new) < max_new_tokens:
        new.append(choose(logits, rng, temperature, top_k))
        if new[-1] == eos or len(new) == max_new_tokens:
            break
        logits = decoder.step(new[-1])
    return new
