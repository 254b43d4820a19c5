"""The second held-out text, unlike the fit text (pydoc's topics and docstrings, texts.corpus) in
genre: the Lee corpus of news articles (300 Australian news stories, one a line), which gensim ships
as test data; read from gensim's folder without importing it, cut into passages of whole sentences."""

import functools
import importlib.util
import re
from pathlib import Path

from compressor.errors import CompressorError

__all__ = [
    "SECOND_PASSAGES",
    "PASSAGE_WORDS",
    "gensim_file",
    "news_file",
    "sentence_passages",
    "all_news_passages",
    "news_passages",
]

# About the size of pydoc's eval split (292 passages): the second text costs bench what the first does.
SECOND_PASSAGES = 300
PASSAGE_WORDS = (40, 90)  # a passage's fewest and most words: 90 words fit the 128-token eval window
LEE_FILE = ("test", "test_data", "lee_background.cor")  # under gensim's folder
# After a sentence's end (., ! or ?, a closing quote or bracket maybe), before a capital or a digit.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(]?[A-Z0-9])|(?<=[.!?][\"')])\s+(?=[\"'(]?[A-Z0-9])")


def gensim_file(parts: tuple[str, ...]) -> tuple[Path | None, str]:
    """(the file at `parts` under the installed gensim's folder, found without importing it, or None; why
    not, said as the end of a sentence about the gensim package)."""
    spec = importlib.util.find_spec("gensim")
    if not spec or not spec.submodule_search_locations:
        return None, "is not installed"
    path = Path(spec.submodule_search_locations[0], *parts)
    return (path, "") if path.is_file() else (None, f"has no {str(path)!r}")


def news_file() -> Path:
    """The Lee corpus file inside the installed gensim."""
    path, missing = gensim_file(LEE_FILE)
    if path is None:
        raise CompressorError(
            f"the default second text, the Lee corpus of news articles, comes with the gensim package, which "
            f"{missing}: pip install gensim (or give a second text of your own, or none)"
        )
    return path


def sentence_passages(article: str) -> list[str]:
    """Consecutive whole sentences of `article`, PASSAGE_WORDS words each. Left out: a sentence longer
    than the most, and a run shorter than the fewest that the next sentence would take past the most
    (4 % of the words in all); a short tail joins the passage before it when that stays within the most."""
    fewest, most = PASSAGE_WORDS
    found: list[list[str]] = []
    current: list[str] = []
    for sentence in SENTENCE_END.split(article.strip()):
        words = sentence.split()
        if len(current) + len(words) > most:
            current = []  # too short to keep on its own, and too long with the next sentence
        if len(words) <= most:
            current += words
        if len(current) >= fewest:
            found.append(current)
            current = []
    if current and found and len(found[-1]) + len(current) <= most:
        found[-1] += current
    return [" ".join(words) for words in found]


@functools.cache
def _all_passages() -> tuple[str, ...]:
    articles = news_file().read_text(encoding="utf-8").splitlines()
    return tuple(dict.fromkeys(p for article in articles for p in sentence_passages(article)))


def all_news_passages() -> list[str]:
    """Every passage of the Lee corpus, in the articles' order, each once."""
    return list(_all_passages())


def news_passages(n: int = SECOND_PASSAGES) -> list[str]:
    """`n` passages evenly spaced over all_news_passages() (passage ⌊i·N/n⌋ for i < n, N of them),
    so every part of the corpus has its share; all of them when N ≤ n."""
    every = _all_passages()
    if len(every) <= n:
        return list(every)
    return [every[i * len(every) // n] for i in range(n)]
