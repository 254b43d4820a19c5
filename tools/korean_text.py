"""A held-out text in another language and script than any the toolkit fits to, for a multilingual encoder's bench:
the articles of the Constitution of the Republic of Korea as the package konlpy 0.6.0 ships it (its kolaw corpus,
`konlpy/data/corpus/kolaw/constitution.txt`), one article a line (the preamble first, then 제1조 … 제130조; the
chapters' headings and the addenda left out). The wheel is downloaded, never installed nor imported (konlpy needs
Java on import), and the file read from it as a zip entry (tools/wheel_parts.py):

    pip download --no-deps --dest runs/downloads/konlpy konlpy==0.6.0
    python tools/korean_text.py --out runs/texts/ko-constitution.txt
    compressor bench FOLDER … --second-text runs/texts/ko-constitution.txt"""

import argparse
import re
import sys
import zipfile
from pathlib import Path

from compressor.errors import CompressorError
from files.atomic import atomic_file
from tools.wheel_parts import Part, member_of

CONSTITUTION = Part("konlpy==0.6.0", "konlpy/data/corpus/kolaw/constitution.txt")
ARTICLE = re.compile(r"^\s*제\d+조(의\d+)?\s")  # an article's first line: 제N조 (or 제N조의M)
HEADING = re.compile(r"^\s*제\d+(장|절)\s")  # a chapter's or section's heading
ADDENDA = re.compile(r"^\s*부칙")  # the addenda: transitional dates, not the text's prose


def articles(text: str) -> list[str]:
    """The preamble and each article of the constitution's `text`, its lines joined, whitespace collapsed."""
    found: list[list[str]] = [[]]
    lines = text.splitlines()[1:]  # the title
    for line in lines:
        if ADDENDA.match(line):
            break
        if HEADING.match(line) or not line.strip():
            continue
        if ARTICLE.match(line):
            found.append([])
        found[-1].append(line.strip())
    return [" ".join(" ".join(parts).split()) for parts in found if parts]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/texts/ko-constitution.txt"), help="text file to write")
    p.add_argument("--downloads", type=Path, default=Path("runs/downloads/konlpy"), help="folder of konlpy's wheel")
    args = p.parse_args(argv)
    try:
        wheel, info = member_of(CONSTITUTION, args.downloads)
        with zipfile.ZipFile(wheel) as z:
            raw = z.read(info)
        try:
            found = articles(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise CompressorError(
                f"{info.filename} in {wheel} is not UTF-8 text (byte {e.start}): not konlpy 0.6.0's file"
            ) from e
        if len(found) < 100:
            raise CompressorError(f"{info.filename} in {wheel} holds {len(found)} articles, not the constitution's 130")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(args.out) as tmp:
            tmp.write_text("\n".join(found) + "\n", encoding="utf-8")
    except CompressorError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {len(found)} passages, {sum(len(a.split()) for a in found):,} words", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
