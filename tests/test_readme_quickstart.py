"""README.md's quick starts run as written, a tiny random model in place of the user's: its shell commands
(taken from the README's own blocks, the placeholder path swapped for the tiny model's) through the command
line, then its Python blocks as they stand, in a folder of their own."""

import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import run_cli, write_tiny_bert, write_tiny_lm

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def section(title: str) -> str:
    """The text under README's `### title`, up to the next heading."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n### {title}\n")
    end = re.compile(r"\n#{2,3} ").search(text, start + 1)
    return text[start : end.start() if end else len(text)]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.DOTALL)


def commands(block: str) -> list[list[str]]:
    """Each shell line of `block` as argv: continuations joined, comments dropped."""
    return [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def run_quick_start(capsys, title: str, model: Path, placeholder: str, extra=()) -> list[str]:
    """Run the section's shell commands: `make install` is the set-up this suite already runs in; each
    `compressor` line goes through the command line with `placeholder` replaced by `model`. Their stdouts."""
    (block,) = blocks(section(title), "sh")
    outs = []
    for argv in commands(block):
        if argv[0] == "make":
            assert argv[1:] == ["install"] and "\ninstall:" in (ROOT / "Makefile").read_text()
            continue
        assert argv[0] == ".venv/bin/compressor", argv
        args = [str(model) if a == placeholder else a for a in argv[1:]]
        assert str(model) in args or args[0] != "run", f"no {placeholder} in {argv}"
        code, out, err = run_cli(capsys, *args, *(extra if args[0] == "run" else ()))
        assert code == 0, f"{shlex.join(argv)}: {err}"
        outs.append(out)
    return outs


def run_python(title: str) -> None:
    for block in blocks(section(title), "python"):
        exec(compile(block, f"README.md, {title}", "exec"), {"__name__": "__readme__"})


def documented_commands() -> list[tuple[str, list[str]]]:
    """(page, argv) of every `compressor …` line in README.md's and docs/'s code blocks and spans (not the lab
    notes: history), continuations joined; one with `…` in it stands for a shape, not a command."""
    pages = [README, *(p for p in (ROOT / "docs").rglob("*.md") if "lab-notes" not in p.parts)]
    found = []
    for page in pages:
        text = page.read_text(encoding="utf-8").replace("\\\n", " ")
        code = re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL) + re.findall(r"`([^`\n]+)`", text)
        for line in (line for block in code for line in block.splitlines()):
            start = re.search(r"(^|\s)(\.venv/bin/)?compressor (?=[a-z])", line)
            if (
                start
                and "…" not in line
                and not re.match(r"\s*(from|import|python) ", line)
                and " " in line[start.end() :]
            ):
                argv = shlex.split(line[start.end() :], comments=True)
                found.append((page.relative_to(ROOT).as_posix(), [a for a in argv if not re.fullmatch(r"\[\w+\]", a)]))
    return found


def test_every_documented_command_parses():
    """Each command the pages show is one the command line takes today: its options and their values."""
    from converters.cli import COMMANDS, build_parser

    commands = documented_commands()
    assert len(commands) > 40 and {argv[0] for _, argv in commands} == set(COMMANDS)
    parser, wrong = build_parser(), []
    for page, argv in commands:
        try:
            parser.parse_args(argv)
        except SystemExit as e:  # --help exits 0
            if e.code:
                wrong.append(f"{page}: compressor {shlex.join(argv)}")
    assert not wrong, "do not parse:\n" + "\n".join(wrong)


@pytest.fixture(scope="module")
def texts_cache(tmp_path_factory) -> Path:
    """One cache for this file's runs: the default texts are built once (about 12 s), not once a test."""
    return tmp_path_factory.mktemp("quickstart-cache")


def test_the_encoder_quick_start(tmp_path, capsys, monkeypatch, texts_cache):
    monkeypatch.setenv("XDG_CACHE_HOME", str(texts_cache))
    monkeypatch.chdir(tmp_path)  # the README's relative paths (runs/yours) land here
    model = write_tiny_bert(tmp_path / "your-model")
    run_quick_start(capsys, "An encoder", model, "path/to/your-model")
    rows = sorted(p.name for p in (tmp_path / "runs" / "yours").iterdir() if p.is_dir())
    table = "original-table3-int8-aware-table"
    assert rows == ["original", "original-int8", "original-int8-aware", "original-int8-w4", table]
    run_python("An encoder")
    out = capsys.readouterr().out
    assert "(2, " in out and "(1, 48)" in out, out  # the hidden states, then one pooled embedding


def test_the_causal_lm_quick_start(tmp_path, capsys, monkeypatch, texts_cache):
    monkeypatch.setenv("XDG_CACHE_HOME", str(texts_cache))
    monkeypatch.chdir(tmp_path)
    model = write_tiny_lm(tmp_path / "your-lm", "llama")
    _, generated = run_quick_start(capsys, "A causal LM", model, "path/to/your-lm")
    assert generated.strip(), "generate printed no tokens"
    assert (tmp_path / "runs" / "your-lm" / "original-int4-aware" / "onnx" / "model_q4.onnx").is_file()


def test_the_own_module_quick_start(tmp_path, capsys, monkeypatch):
    pytest.importorskip("tools.lstm_lm")
    monkeypatch.chdir(tmp_path)
    run_python("Your own PyTorch module")
    assert (tmp_path / "runs" / "mine.onnx").is_file() and "lowrank" in capsys.readouterr().out
