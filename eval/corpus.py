"""Text for calibration, fine-tuning and evaluation: a user's file (one passage per line), or
the English reference documentation that ships with CPython (`pydoc_data.topics`), split
deterministically into three disjoint parts; and a second held-out text unlike it, the
standard library's docstrings (eval.docstrings)."""

import re
import sys
from pathlib import Path

from compressor.errors import CompressorError
from eval.docstrings import all_docstring_paragraphs, docstring_passages

__all__ = ["SPLITS", "SECOND", "HELD_OUT", "default_passages", "read_passages", "passages"]

SPLITS = ("eval", "calib", "finetune")  # paragraph i goes to eval if i % 5 == 0, calib if 1, else finetune
SECOND = "second"  # the second held-out text: by default the standard library's docstrings
HELD_OUT = ("eval", SECOND)  # the texts quality is measured on
MIN_WORDS = 8


def default_passages(split: str) -> list[str]:
    """The paragraphs of pydoc's topics (topics in sorted order) that fall in `split`."""
    if split not in SPLITS:
        raise CompressorError(f"a text split must be one of {', '.join(SPLITS)}, got {split!r}")
    from pydoc_data.topics import topics

    paragraphs = dict.fromkeys(  # several topics repeat a paragraph: keep its first place
        " ".join(p.split())
        for key in sorted(topics)
        for p in re.split(r"\n\s*\n", topics[key])
        if len(p.split()) >= MIN_WORDS
    )
    part = {0: "eval", 1: "calib"}
    return [p for i, p in enumerate(paragraphs) if part.get(i % 5, "finetune") == split]


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
        texts, version = docstring_passages(), f"{sys.version_info.major}.{sys.version_info.minor}"
        spread = f"{len(texts)} of {len(all_docstring_paragraphs())} paragraphs, evenly spaced"
        return texts, f"docstrings of the Python {version} standard library ({spread})"
    rule = {"eval": "i % 5 == 0", "calib": "i % 5 == 1", "finetune": "i % 5 >= 2"}[split]
    return default_passages(split), f"pydoc_data.topics, {split} split (paragraphs with {rule})"
