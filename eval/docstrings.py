"""The second held-out text, unlike pydoc's topics: the docstrings of standard-library modules and
of their public functions and classes, one paragraph per passage, built from the installed
interpreter's standard library (so it is the same for one Python version) and kept in memory."""

import functools
import importlib
import inspect
import re
import warnings

__all__ = ["MODULES", "DOCSTRING_PASSAGES", "all_docstring_paragraphs", "docstring_passages"]

MODULES = (
    "argparse",
    "asyncio",
    "base64",
    "bisect",
    "calendar",
    "collections",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email",
    "enum",
    "fractions",
    "functools",
    "glob",
    "gzip",
    "hashlib",
    "heapq",
    "html",
    "http.client",
    "inspect",
    "io",
    "itertools",
    "json",
    "logging",
    "math",
    "mimetypes",
    "operator",
    "os",
    "pathlib",
    "pickle",
    "pprint",
    "queue",
    "random",
    "re",
    "shutil",
    "socket",
    "sqlite3",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "time",
    "typing",
    "unittest",
    "urllib.parse",
    "uuid",
    "zipfile",
)
MIN_WORDS = 8  # as for pydoc's paragraphs (eval.corpus)
# About the size of pydoc's eval split (292 passages): the second text costs bench what the first does.
DOCSTRING_PASSAGES = 300


def _paragraphs(doc: str):
    for block in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
        text = " ".join(block.split())
        if len(text.split()) >= MIN_WORDS and not text.startswith(">>>"):
            yield text


@functools.cache
def _all_paragraphs() -> tuple[str, ...]:
    from pydoc_data.topics import topics

    pydoc = {" ".join(p.split()) for topic in topics.values() for p in re.split(r"\n\s*\n", topic)}
    seen: dict[str, None] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # typing.io, typing.re
        for name in MODULES:
            module = importlib.import_module(name)
            members = [obj for key, obj in sorted(vars(module).items()) if not key.startswith("_")]
            for obj in [module, *members]:
                doc = getattr(obj, "__doc__", None)
                if (obj is module or inspect.isfunction(obj) or inspect.isclass(obj)) and isinstance(doc, str):
                    seen.update(dict.fromkeys(p for p in _paragraphs(doc) if p not in pydoc))
    return tuple(seen)


def all_docstring_paragraphs() -> list[str]:
    """Every paragraph of ≥ MIN_WORDS words (doctest blocks left out) of the docstrings of MODULES,
    their public functions and classes, in module order, each once, none that pydoc's topics hold."""
    return list(_all_paragraphs())


def docstring_passages(n: int = DOCSTRING_PASSAGES) -> list[str]:
    """`n` paragraphs evenly spaced over all_docstring_paragraphs() (paragraph ⌊i·N/n⌋ for
    i < n, N of them), so every module has its share; all of them when N ≤ n."""
    every = _all_paragraphs()
    if len(every) <= n:
        return list(every)
    return [every[i * len(every) // n] for i in range(n)]
