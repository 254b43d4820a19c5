"""Write a second held-out text, unlike pydoc's topics: the docstrings of standard-library
modules and their public functions and classes, one paragraph per line.

    .venv/bin/python examples/stdlib_docstrings.py runs/stdlib_docstrings.txt
"""

import importlib
import inspect
import re
import sys
from pathlib import Path

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
MIN_WORDS = 8


def paragraphs(doc: str):
    for block in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
        text = " ".join(block.split())
        if len(text.split()) >= MIN_WORDS and not text.startswith(">>>"):
            yield text


def main(out: Path) -> None:
    seen: dict[str, None] = {}
    for name in MODULES:
        module = importlib.import_module(name)
        objects = [module] + [obj for key, obj in sorted(vars(module).items()) if not key.startswith("_")]
        for obj in objects:
            doc = getattr(obj, "__doc__", None)
            if (inspect.isfunction(obj) or inspect.isclass(obj) or obj is module) and isinstance(doc, str):
                seen.update(dict.fromkeys(paragraphs(doc)))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(seen) + "\n")
    print(f"wrote {len(seen)} passages to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/stdlib_docstrings.txt"))
