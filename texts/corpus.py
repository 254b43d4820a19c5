"""Text for calibration, fine-tuning and evaluation: a user's file (one passage per line), or the
default text, in three disjoint splits. Its eval split is paragraph i of the English reference
documentation that ships with CPython (`pydoc_data.topics`) for i % 5 == 0; the fit text (calib and
finetune splits) is pydoc's other paragraphs and the docstring paragraphs of the standard library,
numpy, scipy and matplotlib (texts.docstrings), several MB, built once and cached. The second held-out
text, unlike both in genre, is news (texts.news)."""

import functools
import hashlib
import json
import platform
import sys
from pathlib import Path

from compressor.errors import CompressorError
from files.atomic import atomic_file, cache_dir
from texts.docstrings import Source, docstring_paragraphs, docstring_sources, paragraphs
from texts.news import all_news_passages, news_passages
from texts.wiki import wiki_name, wiki_passages

__all__ = ["SPLITS", "SECOND", "HELD_OUT", "LM_TRAIN", "default_passages", "lm_passages", "read_passages", "passages"]

SPLITS = ("eval", "calib", "finetune")  # pydoc's paragraph i: eval if i % 5 == 0, calib if 1, else finetune
SECOND = "second"  # the second held-out text: by default news articles (texts.news)
HELD_OUT = ("eval", SECOND)  # the texts quality is measured on
FIT = ("calib", "finetune")  # the splits of the fit text
LM_TRAIN = "train"  # the language models the project trains itself (tools/train_lm.py) learn from this split
BUILD = 2  # the fit text's recipe: raise it when the recipe changes, so that cached copies are built again


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


@functools.cache
def _pydoc_paragraphs() -> tuple[str, ...]:
    """The paragraphs of pydoc's topics, topics in sorted order; several topics repeat a
    paragraph: it keeps its first place."""
    from pydoc_data.topics import topics

    return tuple(dict.fromkeys(p for key in sorted(topics) for p in paragraphs(topics[key])))


def _pydoc_split(split: str) -> list[str]:
    part = {0: "eval", 1: "calib"}
    return [p for i, p in enumerate(_pydoc_paragraphs()) if part.get(i % 5, "finetune") == split]


@functools.cache
def _build(sources: tuple[Source, ...], wiki: str | None = None) -> dict[str, tuple[str, ...]]:
    """The fit text: pydoc's calib and finetune paragraphs, and the docstring paragraphs of `sources`
    (and, when `wiki` names them, the Wikipedia passages) that pydoc does not hold, one in five to calib
    by the sha1 of its text (so a paragraph's split does not depend on the others), the rest to
    finetune; each split ordered by its passages' sha1, a pseudo-shuffle, so that any first N passages
    mix all sources."""
    pydoc = set(_pydoc_paragraphs())
    fit = {split: _pydoc_split(split) for split in FIT}
    for p in docstring_paragraphs(list(sources)) + (wiki_passages() if wiki else []):
        if p not in pydoc:
            fit["calib" if int(_sha1(p), 16) % 5 == 0 else "finetune"].append(p)
    return {split: tuple(sorted(texts, key=_sha1)) for split, texts in fit.items()}


def _cache_file(sources: tuple[Source, ...], wiki: str | None = None) -> Path:
    """The fit text's cache file, named by a hash of the recipe, the Python version and the sources'
    names (the packages' versions)."""
    key = json.dumps([BUILD, platform.python_version(), [s.name for s in sources], wiki])
    return cache_dir() / f"default-text-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _load(path: Path) -> dict[str, tuple[str, ...]] | None:
    """The fit text cached at `path`; None, said on stderr when the file is there, if it does not load."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:  # ValueError: not UTF-8, not JSON
        data = e
    if isinstance(data, dict) and all(
        isinstance(data.get(s), list) and data[s] and all(isinstance(p, str) for p in data[s]) for s in FIT
    ):
        return {split: tuple(data[split]) for split in FIT}
    print(f"the cached default text {str(path)!r} does not load; building it again", file=sys.stderr)
    return None


def _save(path: Path, fit: dict[str, tuple[str, ...]]) -> None:
    """Write the fit text to `path` atomically; a warning on stderr if it cannot be."""
    try:
        with atomic_file(path) as tmp:
            tmp.write_text(json.dumps(fit, ensure_ascii=False), encoding="utf-8")
    except (OSError, CompressorError) as e:
        reason = getattr(e, "strerror", None) or e
        print(f"warning: cannot cache the default text in {str(path)!r}: {reason}", file=sys.stderr)


def _cached_fit_text(path: Path, sources: tuple[Source, ...], wiki: str | None = None) -> dict[str, tuple[str, ...]]:
    """The fit text of `sources` (and `wiki`) from the cache file at `path`, else built and written there."""
    fit = _load(path)
    if fit is None:
        fit = _build(sources, wiki)
        _save(path, fit)
    return fit


@functools.cache
def _fit_text() -> dict[str, tuple[str, ...]]:
    sources, wiki = tuple(docstring_sources()), wiki_name()
    return _cached_fit_text(_cache_file(sources, wiki), sources, wiki)


def default_passages(split: str) -> list[str]:
    """The default text's `split`: pydoc's eval paragraphs, or the fit text's calib or finetune split."""
    if split not in SPLITS:
        raise CompressorError(f"a text split must be one of {', '.join(SPLITS)}, got {split!r}")
    return _pydoc_split(split) if split == "eval" else list(_fit_text()[split])


def lm_passages(split: str) -> list[str]:
    """The default text's `split` for a language model the project trains itself: its finetune split
    cut in two by each passage's sha1, a quarter to "finetune" and the rest to LM_TRAIN, so that the
    trained LM never saw the text it is fine-tuned, calibrated or evaluated on."""
    if split not in (*SPLITS, LM_TRAIN):
        known = ", ".join((*SPLITS, LM_TRAIN))
        raise CompressorError(f"a language model's text split is one of {known}, got {split!r}")
    if split not in ("finetune", LM_TRAIN):
        return default_passages(split)
    quarter = split == "finetune"
    return [p for p in default_passages("finetune") if (int(_sha1(p), 16) % 4 == 0) == quarter]


def read_passages(path: str | Path, minimum: int = 1) -> list[str]:
    """Non-empty lines of a UTF-8 text file; at least `minimum` of them."""
    path = Path(path)
    if not path.is_file():
        raise CompressorError(f"text file {str(path)!r} does not exist")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise CompressorError(f"{str(path)!r} is not UTF-8 text (expected one passage per line)") from None
    found = [line.strip() for line in lines if line.strip()]
    if len(found) < minimum:
        raise CompressorError(f"{str(path)!r} has {len(found)} passage(s); at least {minimum} are needed")
    return found


def passages(path: str | Path | None, split: str, minimum: int = 1) -> tuple[list[str], str]:
    """(passages, a description of where they came from) from a file, else the default text of
    `split` (one of SPLITS, or SECOND)."""
    if path is not None:
        return read_passages(path, minimum), str(path)
    if split == SECOND:
        texts = news_passages()
        spread = f"{len(texts)} of its {len(all_news_passages())} passages, evenly spaced"
        return texts, f"news articles of the Lee corpus in gensim's test data ({spread})"
    texts = default_passages(split)
    if split == "eval":
        return texts, "pydoc_data.topics, eval split (paragraphs with i % 5 == 0)"
    names = ", ".join(s.name for s in docstring_sources())
    wiki = wiki_name()
    where = (
        f"pydoc_data.topics, the docstrings of {names} and {wiki}"
        if wiki
        else f"pydoc_data.topics and the docstrings of {names}"
    )
    return texts, f"{where} ({len(texts)} passages, {split} split)"
