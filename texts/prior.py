"""A general-English prior for token frequencies, so that counts from one calibration text do not
rank the whole vocabulary alone: the `wordfreq` package's word frequencies (Wikipedia, subtitles,
news, books, web text, …) pushed through the model's tokenizer, each word's frequency added to
every token of it; blended with the calibration counts c (N = Σ c tokens) as

    c' = (1 − λ) c + λ N p,

so a token the calibration text never holds still weighs λ N p, and c' sums to N as c does
(`converters.calibration.Calibration.with_prior`). A prior can also be saved and read back from a
safetensors file (`save_prior`), for a machine without wordfreq (what `compressor pack` carries)."""

import importlib.util
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from compressor.errors import CompressorError

__all__ = [
    "PRIORS",
    "PRIOR_WEIGHT",
    "PRIOR_WORDS",
    "check_prior",
    "check_wordfreq",
    "prior_for",
    "prior_said",
    "save_prior",
    "token_prior",
]

PRIORS = ("wordfreq", "none")  # or the path of a saved prior's .safetensors file
PRIOR_WEIGHT = 0.5  # λ: measured in BENCHMARKS.md ("A general-English prior")
PRIOR_WORDS = 50_000  # the most frequent English words wordfreq lists


def check_wordfreq(instead: str) -> None:
    """The wordfreq package is installed; else one sentence saying how to install it or do without (`instead`)."""
    if importlib.util.find_spec("wordfreq") is None:
        raise CompressorError(f"the package wordfreq is not installed: pip install wordfreq, or {instead}")


def check_prior(prior: str, weight: float) -> None:
    """Before any work: a known prior, its package installed, a weight in [0, 1]."""
    saved = prior.endswith(".safetensors")
    if prior not in PRIORS and not saved:
        raise CompressorError(
            f"a frequency prior is one of {', '.join(PRIORS)} or a saved prior's .safetensors file, got {prior!r}"
        )
    if saved and not Path(prior).is_file():
        raise CompressorError(f"the saved frequency prior {prior!r} does not exist")
    if saved:
        _saved_prior(prior)
    if not 0 <= weight <= 1:
        raise CompressorError(f"the prior's blend weight must lie in [0, 1], got {weight!r}")
    if prior == "wordfreq":
        check_wordfreq("pass --freq-prior none to rank tokens by the calibration text alone")


def token_prior(tokenizer, vocab: int, words: int = PRIOR_WORDS) -> Tensor:
    """(vocab,) float64 summing to 1: p_t ∝ Σ over English words w of freq(w) × how often t is among w's tokens.
    Each word is tokenized as it stands after a space (the form a BPE vocabulary keeps mid-sentence)."""
    import wordfreq

    listed = wordfreq.top_n_list("en", words)
    ids = _word_ids(tokenizer, [f" {w}" for w in listed])
    pieces = torch.as_tensor([i for word in ids for i in word], dtype=torch.long)
    frequency = torch.as_tensor([wordfreq.word_frequency(w, "en") for w in listed], dtype=torch.float64)
    frequency = frequency.repeat_interleave(torch.as_tensor([len(word) for word in ids]))
    inside = pieces < vocab
    prior = torch.zeros(vocab, dtype=torch.float64).index_add_(0, pieces[inside], frequency[inside])
    if not prior.sum() > 0:
        raise CompressorError("the tokenizer maps no English word into the model's vocabulary: no prior to blend")
    return prior / prior.sum()


def _word_ids(tokenizer, words: list[str]) -> list[list[int]]:
    """Each word's token ids, no special tokens: through the Rust tokenizer itself where there is one (the same ids,
    without transformers' per-word Python: 0.4 s for 50,000 words against 1.7)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return tokenizer(words, add_special_tokens=False)["input_ids"]
    return [e.ids for e in backend.encode_batch(words, add_special_tokens=False)]


def save_prior(path: Path, prior: Tensor) -> None:
    save_file({"prior": prior.to(torch.float64).contiguous()}, str(path))


def prior_for(prior: str, tokenizer, vocab: int) -> Tensor:
    """The prior `prior` names (checked by check_prior): wordfreq's through `tokenizer`, or a saved one,
    which must be a distribution over the model's `vocab` tokens."""
    if prior == "wordfreq":
        return token_prior(tokenizer, vocab)
    saved = _saved_prior(prior)
    if saved.shape != (vocab,):
        raise CompressorError(f"{prior!r} is a frequency prior over {len(saved):,} tokens, not this model's {vocab:,}")
    return saved


def _saved_prior(path: str) -> Tensor:
    """The distribution (float64) a saved prior's file holds; one sentence if it holds none."""
    try:
        saved = load_file(path).get("prior")
    except (SafetensorError, OSError) as e:
        raise CompressorError(f"the saved frequency prior {path!r} cannot be read: {e}") from None
    if saved is None or saved.dim() != 1 or not abs(float(saved.sum()) - 1) < 1e-6:
        raise CompressorError(f"{path!r} holds no frequency prior (a 1-D 'prior' summing to 1: compressor pack's)")
    return saved.to(torch.float64)


def prior_said(prior: str) -> str:
    """How a report names the prior: wordfreq's frequencies, or the saved file's."""
    return "wordfreq's English word frequencies" if prior == "wordfreq" else f"the saved prior {prior!r}"
