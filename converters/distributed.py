"""The fine-tune on several processes, as `torchrun --nproc_per_node N` launches them: PyTorch's process
group (gloo on the CPU, nccl on GPUs) and DistributedDataParallel, nothing of our own. torchrun sets
RANK, LOCAL_RANK and WORLD_SIZE; without them the fine-tune runs alone, as before."""

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from compressor.errors import CompressorError

__all__ = ["World", "world", "process_group", "wrap", "agree_to_stop"]


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


@contextlib.contextmanager
def process_group(device: torch.device):
    """The default process group for this world (none for one process), torn down after."""
    here = world()
    if here.size == 1 or dist.is_initialized():
        yield here
        return
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        yield here
    finally:
        dist.destroy_process_group()


def wrap(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` in DistributedDataParallel when a process group is up (gradients averaged over the
    processes at each backward), else itself."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return model
    ids = [device.index if device.index is not None else world().local_rank] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def agree_to_stop(stop: bool, device: torch.device) -> bool:
    """True on every process when any process would stop (its time budget spent, a NaN loss), so that none
    waits alone for the others' gradients."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return stop
    flag = torch.tensor([float(stop)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())
