"""Each stage of a run (an export, a row's quantization, the bench) timed, with the peak resident memory of the
process while it ran: the kernel's high-water mark (VmHWM) is reset as the stage starts (/proc/self/clear_refs,
Linux), so that each peak is the stage's own; where it cannot be reset, the run's peak so far is said as such. What
earlier stages freed is given back first (eval.memory.trim_heap), not counted again."""

import time
from contextlib import contextmanager
from pathlib import Path

from converters.pipeline.say import say
from eval.memory import trim_heap
from eval.probe import peak_rss_bytes

__all__ = ["Stages"]

CLEAR_REFS = Path("/proc/self/clear_refs")


def _reset_peak() -> bool:
    """Whether the process's peak resident memory was set back to its resident memory now."""
    try:
        CLEAR_REFS.write_text("5")  # 5: reset the peak RSS (proc(5))
    except OSError:
        return False
    return True


class Stages:
    """The stages of one run, in order: {"stage", "seconds", "peak_rss_bytes", "peak_of", "start_rss_bytes"} each
    ("peak_of": "stage", or "run" where the peak could not be reset and is the run's so far; "start_rss_bytes": what
    the process held as the stage began, which its peak counts)."""

    def __init__(self, done: list[dict] | None = None):
        """`done`: the stages an earlier process of the same run did (a run's manifest, rows_manifest.py)."""
        self.done: list[dict] = list(done or [])

    @contextmanager
    def stage(self, name: str):
        """Time the work inside as the stage `name`, said on stderr when it ends."""
        trim_heap()
        own = _reset_peak()
        held = peak_rss_bytes("VmRSS")
        start = time.perf_counter()
        yield
        seconds, peak = time.perf_counter() - start, peak_rss_bytes()
        self.done.append(
            {
                "stage": name,
                "seconds": round(seconds, 1),
                "peak_rss_bytes": peak,
                "peak_of": "stage" if own else "run",
                "start_rss_bytes": held,
            }
        )
        peak_of = f" ({held / 2**30:.2f} at its start)" if own else " (the run so far)"
        say(f"{name}: {seconds:.0f} s, peak RSS {peak / 2**30:.2f} GiB{peak_of}")

    def whole(self) -> dict:
        """The run's stages and, over them, its seconds and peak RSS."""
        return {
            "stages": self.done,
            "seconds": round(sum(s["seconds"] for s in self.done), 1),
            "peak_rss_bytes": max((s["peak_rss_bytes"] for s in self.done), default=0),
        }
