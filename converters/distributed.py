"""The fine-tune on several processes, as `torchrun --nproc_per_node N` launches them: PyTorch's process
group (gloo on the CPU, nccl on GPUs) and DistributedDataParallel, or FSDP (`fully_shard`) for a model
too large for one device, nothing of our own. torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; without
them the fine-tune runs alone, as before."""

import contextlib
import copy

import torch
import torch.distributed as dist
from torch import Tensor, nn

from compressor.errors import CompressorError
from converters.torchrun import world

__all__ = [
    "process_group",
    "wrap",
    "Shards",
    "shard",
    "full_weights",
    "agree_to_stop",
    "check_shares",
    "SHARD_ALONE",
]

SHARD_ALONE = "--shard splits the student over torchrun's processes: launch it with torchrun --nproc_per_node N"


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


def wrap(model: nn.Module, device: torch.device, sharded: bool = False) -> nn.Module:
    """`model` in DistributedDataParallel when a process group is up (gradients averaged over the
    processes at each backward), or with `sharded` a copy of it under FSDP (`shard`); else itself."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return model
    if sharded:
        return shard(model, device)
    ids = [device.index if device.index is not None else world().local_rank] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(
        model, device_ids=ids, find_unused_parameters=True
    )  # a pooler the loss skips


class Shards(nn.Module):
    """A model under FSDP, held as `module`: FSDP changes the class of what it shards, and transformers finds
    the hidden states it records by the model's own class, which this box keeps."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.module = model

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def shard(model: nn.Module, device: torch.device) -> nn.Module:
    """A copy of `model` sharded over the processes by FSDP (ZeRO-3: each process holds 1/N of every
    weight, gradient and optimizer state, a block's weights gathered only while it runs): each block of
    its layer stacks (the children of every ModuleList, the deepest first) one unit, the rest one. `model`
    itself stays whole on the CPU; without a process group, `model`."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return model
    from torch.distributed.device_mesh import init_device_mesh  # FSDP's modules: 0.7 s and sympy at import
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    boxed = Shards(copy.deepcopy(model))
    stacks = [m for m in boxed.modules() if isinstance(m, nn.ModuleList)]
    for block in [b for stack in reversed(stacks) for b in stack]:
        fully_shard(block, mesh=mesh)
    fully_shard(boxed, mesh=mesh)
    return boxed


def full_weights(model: nn.Module) -> dict[str, Tensor]:
    """The whole state of `model`, on the CPU of every process; of a Shards box, its model's."""
    if not isinstance(model, Shards):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k.removeprefix("module."): v.cpu() for k, v in full.items()}


def agree_to_stop(stop: bool, device: torch.device) -> bool:
    """True on every process when any process would stop (its time budget spent, a NaN loss), so that none
    waits alone for the others' gradients."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return stop
    flag = torch.tensor([float(stop)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def check_shares(count: int, what: str) -> None:
    """Under torchrun, `count` things shared by the processes leave each at least one."""
    if count < (size := world().size):
        raise CompressorError(f"{size} processes cannot share {count} {what}: launch torchrun with at most {count}")
