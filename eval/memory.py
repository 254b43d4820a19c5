"""Peak RSS of a fresh process that loads an ONNX model and runs one batch, next to the same
process without the model (eval/probe.py, run as a script; session settings as in
probe.session_options, two intra-op threads). glibc's malloc runs with a fixed mmap threshold:
with its default, adaptive one, freed activation buffers were sometimes kept on the heap and the
peak of the same model jumped between two values 20–25 MB apart from one run to the next. In the process that
compresses, `trim_heap` gives glibc's free memory back (malloc_trim) where big buffers were freed: the sessions of a
0.5B LM's int8 gate left 4.5 GB resident after they went, which every later stage's peak counted."""

import ctypes
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

from compressor.errors import CompressorError

__all__ = ["peak_rss", "MALLOC_ENV", "trim_heap"]

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}  # large buffers always mmapped, returned when freed


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, None where the C library is another."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def trim_heap() -> None:
    """The memory glibc's malloc holds free given back to the system (malloc_trim(0): the top of each arena and its
    free pages within); nothing where the C library is not glibc. Without it, what ONNX Runtime's sessions and
    protobuf's graphs freed stays resident (with malloc's adaptive mmap threshold, big buffers come from its heap)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _probe(path: Path, batch: int, seq: int, vocab: int, no_model: bool, decode: int = 0) -> dict:
    # Run by path, not as eval.probe: importing the eval package would count torch in.
    cmd = [sys.executable, str(Path(__file__).with_name("probe.py")), str(path)]
    cmd += ["--batch", str(batch), "--seq", str(seq), "--vocab", str(vocab), "--threads", "2", "--decode", str(decode)]
    cmd += ["--no-model"] if no_model else []
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **MALLOC_ENV})
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise CompressorError(f"the memory probe failed on {str(path)!r}: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_rss(path: str | Path, vocab: int, batch: int = 8, seq: int = 128, repeats: int = 1, decode: int = 0) -> dict:
    """{"peak_rss_bytes", "baseline_rss_bytes", "rss_stages"}: the smallest peak of `repeats` fresh processes
    each, and that process's peak and resident memory after its session is created and after each batch
    (eval/probe.py's stages: a (1, 16) batch, then one of (`batch`, `seq`); with `decode` tokens, a causal LM's,
    a prompt of `seq` read at batch 1 as a decoder reads it and `decode` tokens one at a time)."""
    path = Path(path)
    probes = (_probe(path, batch, seq, vocab, False, decode) for _ in range(repeats))
    best = min(probes, key=lambda p: p["peak_rss_bytes"])
    baseline = min(_probe(path, batch, seq, vocab, True)["peak_rss_bytes"] for _ in range(repeats))
    return {"peak_rss_bytes": best["peak_rss_bytes"], "baseline_rss_bytes": baseline, "rss_stages": best["stages"]}
