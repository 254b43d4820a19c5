"""Latency of an ONNX graph under ONNX Runtime on the CPU: warm-up runs, then timed runs;
p50 and p90 per (batch, sequence, threads), on windows of a text's tokens or on random ids."""

import time

import numpy as np
from tqdm.auto import tqdm

from eval.graph import make_session
from eval.probe import full_feed, random_batch, text_batch

__all__ = ["SETTINGS", "latency_key", "mean_decode_ms", "time_side_by_side", "measure_latency"]

SETTINGS = ((1, 16, 1), (1, 16, 2), (8, 128, 1), (8, 128, 2))  # (batch, seq, intra-op threads)


def latency_key(batch: int, seq: int, threads: int) -> str:
    return f"b{batch}_s{seq}_t{threads}"


def mean_decode_ms(row: dict) -> float | None:
    """A causal LM's row: its mean time per generated token, ms, over the contexts its decoding was timed at
    (the mean of 1000 / tokens_per_s of each, eval.decode_timing); None for a row not timed by decoding."""
    means = [1e3 / c["tokens_per_s"] for c in (row.get("decode_ms") or {}).values() if c.get("tokens_per_s")]
    return sum(means) / len(means) if means else None


def _timed(session, feed: dict, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - start) * 1e3)
    return times


# A p50 is the median of this many benches' p50s: one slow spell moves one of them, not the figure. Their spread is
# what eval.choice reads as the run's noise: with three, int8-aware's 3 % at (1,16) t1 on MiniLM (its 24 smoothing
# Muls, 4 µs each) fell in or out of int8's by 0.3 % from one make demo to the next
ROUNDS = 5
# More benches while a graph's p50s spread wider than this (max − min over their median), up to MAX_ROUNDS: the
# spread is what eval.choice reads as the run's noise, and one too wide decides nothing (the demo's int8 at (8,128)
# t2 on a busy 2-core machine: 77.8–84.0 ms, 8 %)
WIDE_SPREAD = 0.10
MAX_ROUNDS = 7


def _spread(rounds: list[list[float]]) -> float:
    """(max − min) / median of the rounds' p50s."""
    p50s = [float(np.percentile(one, 50)) for one in rounds]
    return (max(p50s) - min(p50s)) / max(float(np.median(p50s)), 1e-12)


def _percentiles(rounds: list[list[float]]) -> dict:
    """p50: the median of the rounds' p50s (each round a bench of its own); p90 over every timed run."""
    times = [t for one in rounds for t in one]
    p50s = [round(float(np.percentile(one, 50)), 4) for one in rounds]
    return {
        "p50": round(float(np.median(p50s)), 4),
        "p90": round(float(np.percentile(times, 90)), 4),
        "p50_rounds": p50s,
    }


def time_side_by_side(
    sessions, feed: dict, runs: int = 50, warmup: int = 5, per_turn: int = 2, rounds: int = ROUNDS
) -> list[dict]:
    """{"p50": ms, "p90": ms, "p50_rounds": [ms, …]} per session: `rounds` benches of runs/rounds timed calls each
    (at least one), more while a session's p50s spread wider than WIDE_SPREAD (up to MAX_ROUNDS), the p50 the
    median of theirs (_percentiles). In each, the sessions take turns, `per_turn` timed calls each: a slow spell
    of a noisy machine falls on all of them alike."""
    feeds = [full_feed(session, feed) for session in sessions]
    for session, fed in zip(sessions, feeds):
        _timed(session, fed, warmup)
    each = max(1, -(-runs // rounds))
    samples = [[] for _ in sessions]
    while len(samples[0]) < rounds or (
        len(samples[0]) < MAX_ROUNDS and max(_spread(rounds_of) for rounds_of in samples) > WIDE_SPREAD
    ):
        bench = [[] for _ in sessions]
        while len(bench[0]) < each:
            for session, fed, times in zip(sessions, feeds, bench):
                times += _timed(session, fed, min(per_turn, each - len(times)))
        for kept, times in zip(samples, bench):
            kept.append(times)
    return [_percentiles(rounds_of) for rounds_of in samples]


def measure_latency(
    paths, vocab: int, settings=SETTINGS, runs: int = 50, warmup: int = 5, progress: bool = False, stream=None
):
    """For each model, {"b1_s16_t1": {"p50": ms, "p90": ms}, …}, timed side by side on the first
    batch × seq ids of the token `stream` (eval.probe.text_batch), or on random ids in [0, vocab)
    without one."""
    out = [{} for _ in paths]
    bar = tqdm(total=len(settings), desc=f"latency of {len(paths)} models, taking turns", disable=not progress)
    for threads in sorted({t for _, _, t in settings}):
        sessions = [make_session(p, threads=threads) for p in paths]
        for batch, seq, t in settings:
            if t != threads:
                continue
            feed = random_batch(batch, seq, vocab) if stream is None else text_batch(stream, batch, seq)
            timings = time_side_by_side(sessions, feed, runs, warmup)
            for result, timing in zip(out, timings):
                result[latency_key(batch, seq, threads)] = timing
            bar.update()
    bar.close()
    return out
