"""What a fine-tune minimises and what it keeps the best weights by: the distillation loss of a batch
(the model kind's on the outputs, plus per-layer matching) and the agreement on validation batches."""

import torch
from torch import Tensor, nn

from converters.kinds import ModelKind

__all__ = ["layer_loss", "step_loss", "outputs", "agreement"]


def layer_loss(student: tuple[Tensor, ...], teacher: tuple[Tensor, ...], mask: Tensor) -> Tensor:
    """mean over layers l of ‖h_s^l − h_t^l‖² / ‖h_t^l‖² over real tokens."""
    real = mask.bool()
    terms = [
        ((s.float() - t.float())[real] ** 2).sum() / (t.float()[real] ** 2).sum().clamp_min(1e-12)
        for s, t in zip(student, teacher)
    ]
    return torch.stack(terms).mean()


def step_loss(kind: ModelKind, student: nn.Module, teacher: nn.Module, ids: Tensor, mask: Tensor, cfg) -> Tensor:
    """The distillation loss of one batch (the student, or what DistributedDataParallel or FSDP holds it in,
    without dropout; on cuda in bf16 autocast, the teacher a bf16 copy)."""
    with torch.no_grad():
        target, target_layers = kind.outputs(teacher, ids, mask)
    student.eval()  # no dropout: the teacher's targets are deterministic, so is the match
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=ids.device.type == "cuda"):
        out, layers = kind.outputs(student, ids, mask)
    loss = kind.distill_loss(out, target, mask, cfg)
    if cfg.layer_weight:
        loss = loss + cfg.layer_weight * layer_loss(layers, target_layers, mask)
    return loss


@torch.no_grad()
def outputs(kind: ModelKind, model: nn.Module, batches, device) -> list[Tensor]:
    """The model's output on each batch, float32 on the CPU."""
    model.eval()
    return [kind.output(model, ids.to(device), mask.to(device)).float().cpu() for ids, mask in batches]


def agreement(kind: ModelKind, student: nn.Module, batches, targets: list[Tensor], device) -> float:
    """The kind's agreement with the teacher, averaged over the validation batches' examples."""
    scores = [
        kind.agreement(out, t, mask)
        for out, t, (_, mask) in zip(outputs(kind, student, batches, device), targets, batches)
    ]
    return float(torch.cat(scores).mean())
