"""How a command ends: its exit status, and the last line it says where it did not finish (an error's sentence; an
interruption, Ctrl-C or SIGTERM, the way a container or a job scheduler stops a run)."""

import signal
import threading
from collections.abc import Callable

from compressor.errors import CompressorError
from converters.pipeline.say import say

__all__ = ["ended", "StageEnded"]


class StageEnded(CompressorError):
    """A stage run as a child process (torch_free.py) that ended with `exit_code` other than 0: its own last line
    `said`, or not (killed by a signal)."""

    def __init__(self, message: str, exit_code: int, said: bool = True):
        super().__init__(message)
        self.exit_code, self.said = exit_code, said


def _terminated(signum, frame):
    """SIGTERM ends a run as Ctrl-C does: KeyboardInterrupt unwinds every half-written output back off its final
    name."""
    raise KeyboardInterrupt


def ended(work: Callable[[], None]) -> int:
    """`work()`'s exit status: 0; an error's (2: bad input, 1: the machine, a full disk), said; 130 interrupted; a
    child stage's own."""
    main_thread = threading.current_thread() is threading.main_thread()  # where Python lets a handler be set
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        work()
    except StageEnded as e:
        if not e.said:
            say(f"error: {e}")
        return e.exit_code
    except CompressorError as e:
        say(f"error: {e}")
        return getattr(e, "exit_code", 2)
    except KeyboardInterrupt:
        say("interrupted; outputs not yet complete were not written under their final names")
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    return 0
