"""Latency of an ONNX encoder under ONNX Runtime on the CPU: warm-up runs, then timed runs;
p50 and p90 per (batch, sequence, threads)."""

import time

import numpy as np

from eval.graph import make_session
from eval.probe import random_batch

__all__ = ["SETTINGS", "latency_key", "time_session", "measure_latency"]

SETTINGS = ((1, 16, 1), (1, 16, 2), (8, 128, 1), (8, 128, 2))  # (batch, seq, intra-op threads)


def latency_key(batch: int, seq: int, threads: int) -> str:
    return f"b{batch}_s{seq}_t{threads}"


def time_session(session, feed: dict, runs: int = 50, warmup: int = 5) -> dict:
    """{"p50": ms, "p90": ms} of `runs` timed session.run calls after `warmup` untimed ones."""
    for _ in range(warmup):
        session.run(None, feed)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - start) * 1e3)
    return {
        "p50": round(float(np.percentile(times, 50)), 4),
        "p90": round(float(np.percentile(times, 90)), 4),
    }


def measure_latency(path, vocab: int, settings=SETTINGS, runs: int = 50, warmup: int = 5) -> dict:
    """{"b1_s16_t1": {"p50": ms, "p90": ms}, …} for each (batch, seq, threads) setting."""
    out = {}
    for threads in sorted({t for _, _, t in settings}):
        session = make_session(path, threads=threads)
        for batch, seq, t in settings:
            if t != threads:
                continue
            feed = random_batch(batch, seq, vocab)
            out[latency_key(batch, seq, threads)] = time_session(session, feed, runs, warmup)
    return out
