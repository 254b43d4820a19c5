"""The CPU's pace is measured on the widest bench's threads, whatever the machine's cores."""

from threadpoolctl import threadpool_info, threadpool_limits

import eval.pace as pace
from eval.latency import SETTINGS


def test_products_run_on_the_benches_threads(monkeypatch):
    seen = []

    def piece(a, b):
        seen.append(max(pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"))
        return 0.1

    monkeypatch.setattr(pace, "_piece", piece)
    with threadpool_limits(limits=8, user_api="blas"):  # a machine with more cores than the benches use
        assert pace.cpu_pace() == 0.1
    assert max(threads for _, _, threads in SETTINGS) == pace.THREADS
    assert len(seen) == pace.ROUNDS and all(n <= pace.THREADS for n in seen)
