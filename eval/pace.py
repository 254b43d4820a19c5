"""The pace of this CPU now, in a second: the least time of a few rounds of a fixed piece of the work a run does —
float32 products through the BLAS numpy and PyTorch use, on as many threads as the widest bench (eval.latency's
settings: a run's time is mostly benches pinned to one and two threads, so a 16-core machine is not eight 2-core
ones), and a loop of the interpreter (the export's tracing and the rounding's bookkeeping are Python). A run's time
said before it is the time a committed record measured, times this pace over the record's (eval.goals): a slow day,
or a slower CPU, is read in the run's first second rather than found at its end."""

import time

import numpy as np
from threadpoolctl import threadpool_limits

__all__ = ["cpu_pace"]

ROUNDS = 3
SIDE = 768  # the products' side: a layer of MiniLM's width
PRODUCTS = 24
LOOP = 300_000
THREADS = 2  # the BLAS's threads while the products run: the widest of eval.latency's settings (a test says)


def _piece(a: np.ndarray, b: np.ndarray) -> float:
    start = time.perf_counter()
    for _ in range(PRODUCTS):
        a @ b
    total = 0
    for i in range(LOOP):
        total += i & 7
    return time.perf_counter() - start


def cpu_pace() -> float:
    """Seconds of the fixed piece, the least of ROUNDS (about 0.1–0.2 s each on a 2-core EPYC): the larger, the
    slower this CPU is running now."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((SIDE, SIDE), dtype=np.float32) for _ in range(2))
    with threadpool_limits(limits=THREADS, user_api="blas"):
        return round(min(_piece(a, b) for _ in range(ROUNDS)), 4)
