"""The `compressor` command as the shell runs it (pyproject.toml's script). Its process imports nothing heavy before
it knows the command: `compressor run` runs the part of the run that needs PyTorch (the command line, the model,
its export) as a child process, the same command with child.HAND_OVER set, and where that child hands over a run of
the original's rows alone (an LM's goal), runs the rows and the bench itself (torch_free.stage) in a process that
never loaded PyTorch: nothing waits holding the libraries while they work, and while the child works this process
holds a bare Python's 0.02 GiB. Every other command, and a run whose child does all its work, is
`converters.cli.main`'s, in this process or the child."""

import os
import sys
import tempfile
from pathlib import Path

from converters.pipeline.child import HAND_OVER, run_child
from converters.pipeline.ending import ended

__all__ = ["main"]

HANDED_TO_CHILD = ("run",)  # the commands whose torch part runs in a child (the others run here, as they are)


def _run(argv: list[str]) -> None:
    """`compressor ARGV…` in a child process whose torch-free stage, handed over, runs here."""
    with tempfile.TemporaryDirectory(prefix="compressor-") as tmp:
        handed = Path(tmp) / "manifest"
        run_child([sys.executable, sys.argv[0], *argv], f"compressor {argv[0]}", {HAND_OVER: str(handed)})
        manifest = handed.read_text(encoding="utf-8") if handed.exists() else None
    if manifest is not None:  # the stage's libraries (numpy, ONNX Runtime) loaded once the child has gone
        from converters.pipeline.torch_free import stage

        stage(Path(manifest))


def main() -> int:
    """The exit status of `compressor` with this process's command line."""
    argv = sys.argv[1:]
    if argv[:1] and argv[0] in HANDED_TO_CHILD and HAND_OVER not in os.environ:
        return ended(lambda: _run(argv))
    from converters.cli.command_line import main as command  # the command line, PyTorch with it

    return command(argv)
