"""What the commands say: one line on stderr per step."""

import sys

from converters.distributed import world

__all__ = ["say"]


def say(message: str) -> None:
    """A line on stderr, from the first process only under torchrun."""
    if world().main:
        print(f"compressor: {message}", file=sys.stderr)
