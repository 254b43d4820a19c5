"""Latency of an ONNX encoder under ONNX Runtime on the CPU: warm-up runs, then timed runs;
p50 and p90 per (batch, sequence, threads)."""

import time

import numpy as np
from tqdm.auto import tqdm

from eval.graph import make_session
from eval.probe import random_batch

__all__ = ["SETTINGS", "latency_key", "time_session", "measure_latency"]

SETTINGS = ((1, 16, 1), (1, 16, 2), (8, 128, 1), (8, 128, 2))  # (batch, seq, intra-op threads)


def latency_key(batch: int, seq: int, threads: int) -> str:
    return f"b{batch}_s{seq}_t{threads}"


def _timed(session, feed: dict, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _percentiles(times: list[float]) -> dict:
    return {
        "p50": round(float(np.percentile(times, 50)), 4),
        "p90": round(float(np.percentile(times, 90)), 4),
    }


def time_session(session, feed: dict, runs: int = 50, warmup: int = 5) -> dict:
    """{"p50": ms, "p90": ms} of `runs` timed session.run calls after `warmup` untimed ones."""
    _timed(session, feed, warmup)
    return _percentiles(_timed(session, feed, runs))


def measure_latency(
    paths, vocab: int, settings=SETTINGS, runs: int = 50, warmup: int = 5, per_turn: int = 2, progress: bool = False
) -> list:
    """For each model, {"b1_s16_t1": {"p50": ms, "p90": ms}, …}. The models take turns, `per_turn`
    timed calls each, until each has `runs`: a slow spell of a noisy machine falls on all alike."""
    out = [{} for _ in paths]
    bar = tqdm(total=len(settings), desc=f"latency of {len(paths)} models, taking turns", disable=not progress)
    for threads in sorted({t for _, _, t in settings}):
        sessions = [make_session(p, threads=threads) for p in paths]
        for batch, seq, t in settings:
            if t != threads:
                continue
            feed = random_batch(batch, seq, vocab)
            for session in sessions:
                _timed(session, feed, warmup)
            samples = [[] for _ in sessions]
            while len(samples[0]) < runs:
                for session, times in zip(sessions, samples):
                    times += _timed(session, feed, min(per_turn, runs - len(times)))
            for result, times in zip(out, samples):
                result[latency_key(batch, seq, threads)] = _percentiles(times)
            bar.update()
    bar.close()
    return out
