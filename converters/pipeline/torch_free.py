"""The torch-free stage of a run of the original's rows alone (an LM's goal: nothing after the export needs the
model): the process that loaded PyTorch exports the original and writes the rows manifest (rows_manifest.py); then
`stage(OUT/rows-manifest.json)` rounds the rows and runs the bench without importing PyTorch or transformers. Where
it runs is the caller's to say:

- `main([...])` from Python (and `python -m converters.cli`): the process that called it holds PyTorch and its
  caller's state, so the stage runs as its child, `python -m converters.pipeline.torch_free OUT/rows-manifest.json`,
  waited for (child.py: its output relayed, its exit status the run's, the caller's `finally` blocks run). The caller
  waits holding the libraries the export imported (SmolLM2-135M's run: 0.47 GiB beside the child's stages).
- `compressor run` from the shell (converters/cli/shell.py): the command's own process imports nothing heavy and runs
  the torch part of the run as its child, with HAND_OVER set in its environment; that child writes the manifest's
  path into the file HAND_OVER names and ends, and the command's process runs the stage itself. Nothing waits
  holding PyTorch while the rows are rounded and benched (SmolLM2-135M: docs/models.md).

Either way the stage reads the same manifest and runs the same code; the report says which of the libraries its
process imported (`run.torch_free`)."""

import os
import sys
from pathlib import Path

from compressor.errors import CompressorError
from converters.pipeline.child import HAND_OVER, run_child
from converters.pipeline.ending import ended
from converters.pipeline.rows_manifest import MANIFEST, read_manifest
from eval.memory import trim_heap

__all__ = ["round_and_bench", "stage"]


def round_and_bench(manifest: Path) -> None:
    """The torch-free stage of the manifest at `manifest`: handed over to the process that started this one where
    HAND_OVER says so, else run in a child process of this Python, waited for (child.run_child)."""
    handed = os.environ.get(HAND_OVER)
    if handed:
        Path(handed).write_text(str(manifest), encoding="utf-8")
        return
    trim_heap()  # what the export freed given back before the child starts
    argv = [sys.executable, "-m", "converters.pipeline.torch_free", str(manifest)]
    run_child(argv, f"the run's torch-free stage ({' '.join(argv[1:])})")


def _manifest(argv: list[str]) -> Path:
    """The one argument, a manifest's path (one sentence, exit 2, for anything else)."""
    if len(argv) != 1:
        raise CompressorError(
            f"python -m converters.pipeline.torch_free takes one argument, a run's OUT/{MANIFEST}; got {argv}"
        )
    return Path(argv[0])


def stage(manifest: Path) -> None:
    """The rows the manifest at `manifest` has still to add, then the bench and the report, in this process."""
    rows, pending, bench = read_manifest(manifest)
    counts = pending.head_counts
    rows.add_rows(pending.name, pending.graph, {}, pending.schemes, head_counts=lambda config: counts[config.scheme])
    rows.bench_and_report(**bench)


if __name__ == "__main__":
    sys.exit(ended(lambda: stage(_manifest(sys.argv[1:]))))
