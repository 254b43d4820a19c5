"""Peak RSS of a fresh process that loads an ONNX model and runs one batch, next to the same
process without the model. The CPU memory arena is set explicitly (on, ONNX Runtime's default:
with it off, glibc keeps freed activations and the peak of every model rises) in both."""

import json
import subprocess
import sys
from pathlib import Path

__all__ = ["peak_rss"]


def _probe(path: Path, batch: int, seq: int, vocab: int, no_model: bool) -> int:
    cmd = [sys.executable, "-m", "eval.rss_probe", str(path), "--batch", str(batch), "--seq", str(seq)]
    cmd += ["--vocab", str(vocab)] + (["--no-model"] if no_model else [])
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=root)
    return int(json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_bytes"])


def peak_rss(path: str | Path, vocab: int, batch: int = 8, seq: int = 128, repeats: int = 1) -> dict:
    """{"peak_rss_bytes", "baseline_rss_bytes"}: the smallest of `repeats` fresh processes each."""
    path = Path(path)
    return {
        "peak_rss_bytes": min(_probe(path, batch, seq, vocab, False) for _ in range(repeats)),
        "baseline_rss_bytes": min(_probe(path, batch, seq, vocab, True) for _ in range(repeats)),
    }
