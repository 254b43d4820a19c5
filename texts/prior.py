"""A general-English prior for token frequencies, so that counts from one calibration text do not
rank the whole vocabulary alone: the `wordfreq` package's word frequencies (Wikipedia, subtitles,
news, books, web text, …) pushed through the model's tokenizer, each word's frequency added to
every token of it; blended with the calibration counts c (N = Σ c tokens) as

    c' = (1 − λ) c + λ N p,

so a token the calibration text never holds still weighs λ N p, and c' sums to N as c does
(`converters.calibration.Calibration.with_prior`)."""

import importlib.util

import torch
from torch import Tensor

from compressor.errors import CompressorError

__all__ = ["PRIORS", "PRIOR_WEIGHT", "PRIOR_WORDS", "check_prior", "check_wordfreq", "token_prior"]

PRIORS = ("wordfreq", "none")
PRIOR_WEIGHT = 0.5  # λ: measured in BENCHMARKS.md ("A general-English prior")
PRIOR_WORDS = 50_000  # the most frequent English words wordfreq lists


def check_wordfreq(instead: str) -> None:
    """The wordfreq package is installed; else one sentence saying how to install it or do without (`instead`)."""
    if importlib.util.find_spec("wordfreq") is None:
        raise CompressorError(f"the package wordfreq is not installed: pip install wordfreq, or {instead}")


def check_prior(prior: str, weight: float) -> None:
    """Before any work: a known prior, its package installed, a weight in [0, 1]."""
    if prior not in PRIORS:
        raise CompressorError(f"a frequency prior is one of {', '.join(PRIORS)}, got {prior!r}")
    if not 0 <= weight <= 1:
        raise CompressorError(f"the prior's blend weight must lie in [0, 1], got {weight!r}")
    if prior == "wordfreq":
        check_wordfreq("pass --freq-prior none to rank tokens by the calibration text alone")


def token_prior(tokenizer, vocab: int, words: int = PRIOR_WORDS) -> Tensor:
    """(vocab,) float64 summing to 1: p_t ∝ Σ over English words w of freq(w) × how often t is among w's tokens.
    Each word is tokenized as it stands after a space (the form a BPE vocabulary keeps mid-sentence)."""
    import wordfreq

    listed = wordfreq.top_n_list("en", words)
    ids = tokenizer([f" {w}" for w in listed], add_special_tokens=False)["input_ids"]
    prior = torch.zeros(vocab, dtype=torch.float64)
    for word, pieces in zip(listed, ids):
        pieces = torch.as_tensor([i for i in pieces if i < vocab], dtype=torch.long)
        frequency = wordfreq.word_frequency(word, "en")
        prior.index_add_(0, pieces, torch.full((len(pieces),), frequency, dtype=torch.float64))
    if not prior.sum() > 0:
        raise CompressorError("the tokenizer maps no English word into the model's vocabulary: no prior to blend")
    return prior / prior.sum()
