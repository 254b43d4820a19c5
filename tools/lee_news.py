"""Write the whole second held-out text, the news passages of the Lee corpus (texts.news), one
passage per line; bench and run measure on an evenly spaced part of it by default.

    .venv/bin/python tools/lee_news.py runs/lee_news.txt
"""

import sys
from pathlib import Path

from files.atomic import atomic_file
from texts.news import all_news_passages


def main(out: Path) -> None:
    passages = all_news_passages()
    with atomic_file(out) as tmp:
        tmp.write_text("\n".join(passages) + "\n")
    print(f"wrote {len(passages)} passages to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/lee_news.txt"))
