"""What a fine-tune minimises and what it keeps the best weights by: the distillation loss of a batch
(the model kind's on the outputs, plus per-layer matching) and the agreement on validation batches."""

from collections.abc import Callable

import torch
from torch import Tensor, nn

from converters.kinds import ModelKind

__all__ = ["HELD_TARGET_BYTES", "layer_loss", "step_loss", "validation_targets", "agreement"]


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


# The most bytes the teacher's validation outputs are held in between evaluations: an LM's logits over Qwen2.5's
# 151,936-token vocabulary on the 3,392 validation positions were 2.1 GB, as large as the 0.5B student's weights
HELD_TARGET_BYTES = 256 * 2**20


@torch.no_grad()
def _output(kind: ModelKind, model: nn.Module, batch: tuple[Tensor, Tensor], device) -> Tensor:
    """The model's output on one batch, float32 on the CPU."""
    model.eval()
    ids, mask = batch
    return kind.output(model, ids.to(device), mask.to(device)).float().cpu()


def validation_targets(kind: ModelKind, teacher: nn.Module, batches, device) -> Callable[[int], Tensor]:
    """i → the teacher's output on the validation batch i: held from the start while all of them take at most
    HELD_TARGET_BYTES (counted from the first batch's bytes a position), else made again at each call."""
    first = _output(kind, teacher, batches[0], device)
    positions = sum(ids.numel() for ids, _ in batches)
    if first.nbytes / batches[0][0].numel() * positions > HELD_TARGET_BYTES:
        return lambda i: _output(kind, teacher, batches[i], device)
    return [first, *(_output(kind, teacher, batch, device) for batch in batches[1:])].__getitem__


def agreement(kind: ModelKind, student: nn.Module, batches, target: Callable[[int], Tensor], device) -> float:
    """The kind's agreement with the teacher (`target(i)`: its output on batch i), averaged over the validation
    batches' examples; each batch's output let go before the next is made."""
    scores = [
        kind.agreement(_output(kind, student, batch, device), target(i), batch[1]) for i, batch in enumerate(batches)
    ]
    return float(torch.cat(scores).mean())
