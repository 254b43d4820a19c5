"""Write the whole second held-out text, the standard library's docstrings (eval.docstrings), one
paragraph per line; bench and run measure on an evenly spaced part of it by default.

    .venv/bin/python examples/stdlib_docstrings.py runs/stdlib_docstrings.txt
"""

import sys
from pathlib import Path

from eval.atomic import atomic_file
from eval.docstrings import all_docstring_paragraphs


def main(out: Path) -> None:
    passages = all_docstring_paragraphs()
    with atomic_file(out) as tmp:
        tmp.write_text("\n".join(passages) + "\n")
    print(f"wrote {len(passages)} passages to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/stdlib_docstrings.txt"))
