"""Docstring paragraphs for the default fit text (texts.corpus): the docstrings of the modules,
classes and functions in the .py files of the standard library and of the installed numpy, scipy
and matplotlib, read with `ast` (nothing is imported), split into paragraphs."""

import ast
import importlib.metadata
import importlib.util
import os
import re
import sys
import sysconfig
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MIN_WORDS", "PACKAGES", "Source", "docstring_sources", "paragraphs", "docstring_paragraphs"]

MIN_WORDS = 8  # a paragraph's fewest words, in pydoc's topics and in docstrings alike
PACKAGES = ("numpy", "scipy", "matplotlib")  # read when installed, besides the standard library
# Standard-library folders that are tests, demos, GUI code, bundled wheels or other packages.
STDLIB_SKIP = ("idlelib", "lib2to3", "tkinter", "turtledemo", "ensurepip", "site-packages", "pydoc_data")
ALWAYS_SKIP = ("test", "tests", "__pycache__")
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
BODIES = ("body", "orelse", "handlers", "finalbody", "cases")  # the fields of a node that hold statements


@dataclass(frozen=True)
class Source:
    """A folder whose .py files' docstrings are read, named as a description says it ("numpy 2.4.6")."""

    name: str
    folder: Path
    skip: tuple[str, ...] = ALWAYS_SKIP  # folder names not entered (a trailing * matches a prefix)

    def skips(self, folder: str) -> bool:
        return any(folder.startswith(s[:-1]) if s.endswith("*") else folder == s for s in self.skip)


def docstring_sources() -> list[Source]:
    """The standard library, then each of PACKAGES that is installed (found without importing it)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found = [Source(f"the Python {version} standard library", stdlib, ALWAYS_SKIP + STDLIB_SKIP + ("config-*",))]
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        try:
            found.append(
                Source(f"{package} {importlib.metadata.version(package)}", Path(spec.submodule_search_locations[0]))
            )
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _files(source: Source) -> Iterator[Path]:
    """The .py files under the source's folder, in sorted order, skipped folders left out."""
    for root, folders, files in os.walk(source.folder):
        folders[:] = sorted(f for f in folders if not source.skips(f))
        yield from (Path(root, f) for f in sorted(files) if f.endswith(".py"))


def _docstrings(path: Path) -> Iterator[str]:
    """The docstrings of the module, classes and functions of one file, in the file's order; none when it does not
    parse."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning: invalid escape sequences in old code
            tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError, RecursionError):  # ValueError: undecodable bytes, NUL bytes
        return
    stack = [tree]  # the statements alone: a docstring is never inside an expression (ast.walk visits every node)
    while stack:
        node = stack.pop()
        if isinstance(node, DOCUMENTED) and (doc := ast.get_docstring(node)):
            yield doc
        stack.extend(reversed([s for field in BODIES for s in getattr(node, field, ())]))


def paragraphs(text: str) -> Iterator[str]:
    """The blocks of `text` between blank lines, whitespace-normalised, of at least MIN_WORDS words."""
    for block in re.split(r"\n\s*\n", text):
        if len(words := block.split()) >= MIN_WORDS:
            yield " ".join(words)


def docstring_paragraphs(sources: list[Source]) -> list[str]:
    """Every paragraph (doctest blocks left out) of the docstrings of `sources`, in their order and
    their files' sorted order, each once."""
    seen: dict[str, None] = {}
    for source in sources:
        for path in _files(source):
            for doc in _docstrings(path):
                seen.update(dict.fromkeys(p for p in paragraphs(doc) if not p.startswith(">>>")))
    return list(seen)
