"""Run in a fresh process: load an ONNX encoder, run one batch, print peak RSS as JSON.

python -m eval.rss_probe MODEL.onnx --batch 8 --seq 128 [--no-model]
With --no-model the process imports the same libraries and does nothing else (the baseline)."""

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("onnx")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-model", action="store_true")
    args = parser.parse_args()

    import onnxruntime  # noqa: F401  (imported in both runs, so the baseline counts it)

    from eval.graph import make_session
    from eval.latency import random_batch

    if not args.no_model:
        session = make_session(args.onnx, threads=args.threads)
        session.run(None, random_batch(args.batch, args.seq, args.vocab))
    print(json.dumps({"peak_rss_bytes": peak_rss_bytes()}))


def peak_rss_bytes() -> int:
    """VmHWM of this process. (getrusage's ru_maxrss would carry the parent's peak across
    fork and exec on Linux.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("/proc/self/status has no VmHWM line (peak RSS needs Linux)")


if __name__ == "__main__":
    main()
