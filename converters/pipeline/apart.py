"""A run of the original's rows alone (an LM's goal: nothing after the export needs the model) goes on without
PyTorch and transformers once the original is exported: the process becomes a fresh Python (os.execve: the same
process id, output, signals and exit status) that imports neither and rounds the rows and runs the bench (rows.py).
SmolLM2's run held 0.48–0.51 GiB at each stage's start in one process, 0.08–0.14 in the fresh one; its peak went
from 1.64 GiB (3.3× its fp32 weights) to 1.20 (2.4×): its int4-aware stage's from 1.64 to 1.25 (to 1.20 with its
sensitivity probe's session keeping no arena), its bench's from 1.55 to 1.17 (BENCHMARKS.md, "LMs at scale").

The rows' state goes over in an unlinked temporary file, open across the exec and read once by the process that
wrote it (no one else can name it): `python -m converters.pipeline.apart FD`."""

import os
import pickle
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

from compressor.errors import CompressorError
from converters.pipeline.ending import ended
from converters.pipeline.rows import Rows

__all__ = ["go_on_apart"]

PACKAGES = Path(__file__).resolve().parents[2]  # where `converters` is imported from, for the fresh process


def go_on_apart(rows: Rows, path: Path, schemes, head_counts: dict, bench: dict) -> NoReturn:
    """The rest of the run in a fresh process of this one's id: `rows` of the graph at `path` in each of `schemes`
    (the original's), their head rows ranked by `head_counts` (scheme → counts, where a scheme keeps a head), then
    `rows.bench_and_report(**bench)`."""
    python_path = os.pathsep.join(filter(None, [str(PACKAGES), os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryFile() as state:  # open until the exec, which never returns
        pickle.dump((sys.argv, rows, path, schemes, head_counts, bench), state)
        state.flush()
        state.seek(0)
        os.set_inheritable(state.fileno(), True)
        sys.stdout.flush()
        sys.stderr.flush()
        argv = [sys.executable, "-m", "converters.pipeline.apart", str(state.fileno())]
        os.execve(sys.executable, argv, {**os.environ, "PYTHONPATH": python_path})


def _state_file(argv: list[str]) -> int:
    """The one argument, the number of the unlinked file go_on_apart left open (checked: one sentence, exit 2, for
    anything else: this entry point is `compressor run`'s own, not one to call)."""
    said = "python -m converters.pipeline.apart FD is run by `compressor run` itself, FD the state file it left open"
    if len(argv) != 1 or not argv[0].isdigit():
        raise CompressorError(f"{said}; got {' '.join(argv) or 'no argument'}")
    try:
        unlinked = os.fstat(int(argv[0])).st_nlink == 0
    except OSError:
        unlinked = False
    if not unlinked:
        raise CompressorError(f"{said}; {argv[0]} is not an open file without a name")
    return int(argv[0])


def _rows_and_bench(fd: int) -> None:
    """What go_on_apart handed on through the file `fd`, done, under the command line the run was given (the
    report's command) and said in the report (`run.apart`: the libraries this process imported of those it left)."""
    with os.fdopen(fd, "rb") as state:
        sys.argv[:], rows, path, schemes, head_counts, bench = pickle.load(state)
    rows.apart = True
    rows.add_rows("original", path, {}, schemes, head_counts=lambda config: head_counts[config.scheme])
    rows.bench_and_report(**bench)


if __name__ == "__main__":
    sys.exit(ended(lambda: _rows_and_bench(_state_file(sys.argv[1:]))))
