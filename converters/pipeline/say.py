"""What the commands say: one line on stderr per step."""

import sys

from tqdm.auto import tqdm

from converters.torchrun import world

__all__ = ["say"]


def say(message: str) -> None:
    """A line on stderr, from the first process only under torchrun; above a progress bar that is running
    (tqdm.write), not glued to its end."""
    if world().main:
        tqdm.write(f"compressor: {message}", file=sys.stderr)
