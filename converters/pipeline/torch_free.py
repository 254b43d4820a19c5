"""The torch-free stage of a run of the original's rows alone (an LM's goal: nothing after the export needs the
model): the process that loaded PyTorch exports the original, writes the rows manifest (rows_manifest.py), lets the
model go and runs `python -m converters.pipeline.torch_free OUT/rows-manifest.json`, which rounds the rows and runs
the bench without importing PyTorch or transformers, and waits for it. The same road from `compressor run` and from
`main([...])` in Python: the child's output is relayed to this process's sys.stdout and sys.stderr as it comes, its
exit status is the run's (ending.StageEnded), and the parent's `finally` blocks run.

Why the parent exports and the child rounds, rather than the other way round: the command line imports PyTorch
before any work (the kinds, the spec), so a torch stage as the child would leave a parent that holds the libraries
all the same, beside a child that loads them again. Here the parent holds them idle while the child works, its model
freed and its heap given back (eval.memory.trim_heap): a tiny LM's run's parent holds 0.44 GiB (0.29 anonymous, the
rest the libraries' mapped files), the share of the libraries in the 0.48–0.51 GiB a run in one process held at each
stage's start. The child's stages, each measured in its own process (stages.py, the report's `run.stages`), hold
what a fresh process without the libraries holds; the machine holds the parent's idle libraries beside them, the
price of a road that returns to its caller (SmolLM2-135M's run: 1.74 GiB in its processes together against
1.20 in one process id, the parent holding the modules the export imported: docs/models.md). The child's report
says which of the libraries it imported (`run.torch_free`)."""

import codecs
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from compressor.errors import CompressorError
from converters.pipeline.ending import StageEnded, ended
from converters.pipeline.rows_manifest import MANIFEST, read_manifest
from eval.memory import trim_heap

__all__ = ["round_and_bench"]

PACKAGES = Path(__file__).resolve().parents[2]  # where `converters` is imported from, for the child


def _relay(source: IO[bytes], sink: IO[str]) -> None:
    """What the child writes to `source`, written to `sink` as it comes (whole characters)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in iter(lambda: source.read1(65536), b""):
        sink.write(decoder.decode(chunk))
        sink.flush()
    sink.write(decoder.decode(b"", final=True))


def round_and_bench(manifest: Path) -> None:
    """The torch-free stage of the manifest at `manifest`, in a child process of this Python, waited for; its
    output relayed to sys.stdout and sys.stderr; an exit status other than 0 raised as StageEnded. Interrupted
    (Ctrl-C, SIGTERM), the child is sent SIGTERM, which it unwinds as Ctrl-C, and waited for."""
    trim_heap()  # what the export freed given back before the child starts
    python_path = os.pathsep.join(filter(None, [str(PACKAGES), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "converters.pipeline.torch_free", str(manifest)]
    sys.stdout.flush()
    sys.stderr.flush()
    # its own process group: a terminal's Ctrl-C reaches this process alone, which hands it on once
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=0) as child:
        relays = [
            threading.Thread(target=_relay, args=(child.stdout, sys.stdout), daemon=True),
            threading.Thread(target=_relay, args=(child.stderr, sys.stderr), daemon=True),
        ]
        for relay in relays:
            relay.start()
        try:
            status = child.wait()
        except BaseException:
            child.terminate()
            child.wait()
            raise
        finally:
            for relay in relays:
                relay.join()
    stage = f"the run's torch-free stage ({' '.join(argv[1:])})"
    if status < 0:  # killed by a signal (the kernel's out-of-memory killer's is SIGKILL), with nothing said
        raise StageEnded(f"{stage} was killed by {signal.Signals(-status).name}", 128 - status, said=False)
    if status != 0:
        raise StageEnded(f"{stage} ended with exit status {status}", status)


def _manifest(argv: list[str]) -> Path:
    """The one argument, a manifest's path (one sentence, exit 2, for anything else)."""
    if len(argv) != 1:
        raise CompressorError(
            f"python -m converters.pipeline.torch_free takes one argument, a run's OUT/{MANIFEST}; got {argv}"
        )
    return Path(argv[0])


def _stage(manifest: Path) -> None:
    """The rows the manifest has still to add, then the bench and the report."""
    rows, pending, bench = read_manifest(manifest)
    counts = pending.head_counts
    rows.add_rows(pending.name, pending.graph, {}, pending.schemes, head_counts=lambda config: counts[config.scheme])
    rows.bench_and_report(**bench)


if __name__ == "__main__":
    sys.exit(ended(lambda: _stage(_manifest(sys.argv[1:]))))
