"""A stage of a command run as a child process of this Python, waited for: its output relayed to this process's
sys.stdout and sys.stderr as it comes (a caller that captures them, a test's or a notebook's, reads it), its exit
status other than 0 raised as ending.StageEnded, and an interruption (Ctrl-C, SIGTERM) handed on to it as SIGTERM,
which it unwinds as Ctrl-C. The child imports `converters` from where this process did. A child started with
HAND_OVER in its environment hands the rest of its work back to the process that started it (torch_free.py)."""

import codecs
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from converters.pipeline.ending import StageEnded

__all__ = ["HAND_OVER", "run_child"]

# Set by the shell's command for the torch part of a run it runs as its child: the file the child names its rows
# manifest in, for the command's own process to run the torch-free stage (converters/cli/shell.py)
HAND_OVER = "COMPRESSOR_HAND_OVER_TO"
PACKAGES = Path(__file__).resolve().parents[2]  # where `converters` is imported from, for the child


def _relay(source: IO[bytes], sink: IO[str]) -> None:
    """What the child writes to `source`, written to `sink` as it comes (whole characters)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in iter(lambda: source.read1(65536), b""):
        sink.write(decoder.decode(chunk))
        sink.flush()
    sink.write(decoder.decode(b"", final=True))


def run_child(argv: list[str], stage: str, env: dict[str, str] | None = None) -> None:
    """`argv` run with this process's environment and `env`, waited for; `stage` names it where it ends otherwise
    than with status 0 (StageEnded: its status; killed by a signal, said here, since the child could not)."""
    python_path = os.pathsep.join(filter(None, [str(PACKAGES), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, **(env or {}), "PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1"}
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
    if status < 0:  # killed by a signal (the kernel's out-of-memory killer's is SIGKILL), with nothing said
        raise StageEnded(f"{stage} was killed by {signal.Signals(-status).name}", 128 - status, said=False)
    if status != 0:
        raise StageEnded(f"{stage} ended with exit status {status}", status)
