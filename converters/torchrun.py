"""This process's place among torchrun's, read from the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK):
no PyTorch, so that what every command says (pipeline/say.py) imports without it."""

import os
from dataclasses import dataclass

from compressor.errors import CompressorError

__all__ = ["World", "world"]


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """The process that evaluates, logs and writes."""
        return self.rank == 0


def world() -> World:
    """This process's place among torchrun's (rank 0 of 1 without torchrun)."""
    try:
        rank, size, local = (int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0)))
    except ValueError as e:
        raise CompressorError(f"torchrun's RANK, WORLD_SIZE and LOCAL_RANK must be integers: {e}") from None
    return World(rank, size, local)
