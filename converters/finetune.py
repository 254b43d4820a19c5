"""finetune_(student, teacher, ...): distil the original model into its compressed copy.

The loss per batch is the model kind's (an encoder: (1 − cos(pool(h_s), pool(h_t))) · w_cos +
‖h_s − h_t‖² / ‖h_t‖² · w_hidden over real tokens, pool = mean over real tokens). The teacher's
outputs are computed once, before training. AdamW on the compressed modules only (default) or on
every parameter, the others at a smaller rate (they start trained); the rate warms up, then
decays linearly to 0 at the end of the step or time budget. `cuda` with bf16 autocast when
present, else the CPU with all cores (the thread setting restored after); the best weights by
the kind's agreement on a held-out validation split are kept."""

import contextlib
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from compressor.errors import CompressorError
from converters.kinds import ModelKind, kind_of

__all__ = [
    "FinetuneConfig",
    "FinetuneReport",
    "SCHEDULES",
    "TRAINABLE",
    "finetune_",
    "trainable_parameters",
    "pick_device",
]

TRAINABLE = ("compressed", "all")
SCHEDULES = ("constant", "linear")


@dataclass(frozen=True)
class FinetuneConfig:
    steps: int | None = None  # stop after this many steps …
    seconds: float | None = 300.0  # … or this much wall time, whichever comes first
    lr: float = 2e-3  # of the compressed modules' parameters
    rest_lr: float = 1e-4  # of the others, with trainable="all": they start trained, so smaller steps
    schedule: str = "linear"  # warm up over warmup_steps, then decay to 0 at the budget's end; or "constant"
    warmup_steps: int = 20
    batch_size: int = 32
    max_length: int = 64
    trainable: str = "compressed"
    cosine_weight: float = 1.0
    hidden_weight: float = 1.0
    eval_every: int = 50
    seed: int = 0

    def __post_init__(self):
        if self.steps is None and self.seconds is None:
            raise CompressorError("a fine-tune needs a step budget, a time budget, or both")
        if self.steps is not None and (isinstance(self.steps, bool) or self.steps < 0):
            raise CompressorError(f"fine-tune steps must be ≥ 0, got {self.steps!r}")
        if self.seconds is not None and self.seconds <= 0:
            raise CompressorError(f"a fine-tune time budget must be > 0 seconds, got {self.seconds!r}")
        if self.trainable not in TRAINABLE:
            raise CompressorError(f"trainable must be one of {', '.join(TRAINABLE)}, got {self.trainable!r}")
        if self.schedule not in SCHEDULES:
            raise CompressorError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if not self.lr > 0 or not self.rest_lr > 0 or self.batch_size < 1 or self.max_length < 2 or self.eval_every < 1:
            raise CompressorError(f"learning rate, batch size, length and interval must be positive: {self}")


@dataclass
class FinetuneReport:
    device: str
    steps: int = 0
    seconds: float = 0.0
    trainable_params: int = 0
    best_step: int = 0
    best_val_cosine: float = float("nan")
    start_val_cosine: float = float("nan")
    losses: list[float] = field(default_factory=list)  # mean loss per eval interval
    stopped: str = ""  # why it stopped early (NaN loss, interrupt), empty otherwise

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "steps_per_second": round(self.steps_per_second, 3)}


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def trainable_parameters(
    student: nn.Module, which: str, compact_types: tuple[type, ...]
) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(the compact modules' parameters, the others if `which` is "all"), the rest frozen."""
    compact = {id(p) for m in student.modules() if isinstance(m, compact_types) for p in m.parameters()}
    groups: tuple[list[nn.Parameter], list[nn.Parameter]] = ([], [])
    for p in student.parameters():
        p.requires_grad_(which == "all" or id(p) in compact)
        if p.requires_grad:
            groups[id(p) not in compact].append(p)
    if not groups[0] and which == "compressed":
        raise CompressorError("the model has no compressed modules to train; use trainable='all'")
    return groups


def _windows(tokenizer, texts: list[str], length: int) -> list[list[int]]:
    """Each passage cut into consecutive windows of at most `length` tokens, each with its special
    tokens ([CLS] … [SEP]): the whole text is seen, not only each passage's start."""
    enc = tokenizer(texts, truncation=True, max_length=length, return_overflowing_tokens=True, stride=0)
    return list(enc["input_ids"])


def _batches(tokenizer, texts: list[str], cfg: FinetuneConfig) -> list[tuple[Tensor, Tensor]]:
    """Windows of at most max_length tokens, sorted by length and cut into batches, each padded to its longest."""
    windows = sorted(_windows(tokenizer, texts, cfg.max_length), key=len)
    out = []
    for start in range(0, len(windows), cfg.batch_size):
        chunk = windows[start : start + cfg.batch_size]
        enc = tokenizer.pad({"input_ids": chunk}, padding=True, return_tensors="pt")
        out.append((enc["input_ids"], enc["attention_mask"]))
    return out


def _lr_factor(cfg: FinetuneConfig, step: int, elapsed: float) -> float:
    """Multiplier of the learning rate at `step` (0-based) after `elapsed` seconds: 1 when constant;
    linear: min(1, (step+1)/warmup) · (1 − progress), progress the larger spent fraction of the budgets."""
    if cfg.schedule == "constant":
        return 1.0
    spent = [step / cfg.steps] if cfg.steps else []
    spent += [elapsed / cfg.seconds] if cfg.seconds else []
    return min(1.0, (step + 1) / max(cfg.warmup_steps, 1)) * max(0.0, 1.0 - max(spent))


@torch.no_grad()
def _outputs(kind: ModelKind, model: nn.Module, batches, device) -> list[Tensor]:
    """The model's output on each batch, float32 on the CPU."""
    model.eval()
    return [kind.output(model, ids.to(device), mask.to(device)).float().cpu() for ids, mask in batches]


def _agreement(kind: ModelKind, student: nn.Module, batches, targets: list[Tensor], device) -> float:
    """The kind's agreement with the teacher, averaged over the validation batches' examples."""
    scores = [
        kind.agreement(out, t, mask)
        for out, t, (_, mask) in zip(_outputs(kind, student, batches, device), targets, batches)
    ]
    return float(torch.cat(scores).mean())


@contextlib.contextmanager
def _threads(device: torch.device):
    """All cores for a CPU fine-tune, the process's setting restored after."""
    before = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(os.cpu_count() or 1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def finetune_(
    student: nn.Module,
    teacher: nn.Module,
    tokenizer,
    texts: list[str],
    val_texts: list[str],
    cfg: FinetuneConfig,
    compact_types: tuple[type, ...],
    device: torch.device | None = None,
    progress: bool = True,
) -> FinetuneReport:
    """Train `student` in place to match `teacher` on `texts`; keep its best weights by
    agreement on `val_texts`. Returns what happened (steps, time, losses, why it stopped)."""
    if not texts:
        raise CompressorError("no fine-tune text: give a file with at least one passage")
    if not val_texts:
        raise CompressorError("no validation text for the fine-tune")
    device = device or pick_device()
    report = FinetuneReport(device=str(device))
    if cfg.steps == 0:
        report.stopped = "0 steps asked: skipped"
        return report
    with _threads(device):
        _train(
            kind_of(student),
            student,
            teacher,
            tokenizer,
            texts,
            val_texts,
            cfg,
            compact_types,
            device,
            progress,
            report,
        )
    return report


def _train(kind, student, teacher, tokenizer, texts, val_texts, cfg, compact_types, device, progress, report) -> None:
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    teacher.to(device)
    student.to(device)
    train, val = _batches(tokenizer, texts, cfg), _batches(tokenizer, val_texts, cfg)
    train_targets, val_targets = _outputs(kind, teacher, train, device), _outputs(kind, teacher, val, device)
    compact, rest = trainable_parameters(student, cfg.trainable, compact_types)
    report.trainable_params = sum(p.numel() for p in compact + rest)
    groups = [{"params": ps, "lr": lr} for ps, lr in ((compact, cfg.lr), (rest, cfg.rest_lr)) if ps]
    optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
    for group in optimizer.param_groups:
        group["initial_lr"] = group["lr"]
    best_state = {k: v.detach().clone() for k, v in student.state_dict().items()}
    report.start_val_cosine = report.best_val_cosine = _agreement(kind, student, val, val_targets, device)

    order: list[int] = []
    window: list[float] = []
    start = time.perf_counter()
    bar = tqdm(total=cfg.steps, desc="fine-tune", disable=not progress, unit="step")
    try:
        while True:
            elapsed = time.perf_counter() - start
            if (cfg.steps is not None and report.steps >= cfg.steps) or (
                cfg.seconds is not None and elapsed >= cfg.seconds
            ):
                break
            if not order:
                order = list(range(len(train)))
                rng.shuffle(order)
            i = order.pop()
            ids, mask = train[i]
            student.train()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                out = kind.output(student, ids.to(device), mask.to(device))
            loss = kind.distill_loss(out, train_targets[i].to(device), mask.to(device), cfg)
            value = float(loss.detach())
            if not math.isfinite(value):
                report.stopped = f"loss became {value} at step {report.steps + 1}; kept the best weights"
                break
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            for group in optimizer.param_groups:
                group["lr"] = group["initial_lr"] * _lr_factor(cfg, report.steps, elapsed)
            optimizer.step()
            report.steps += 1
            window.append(value)
            bar.update()
            bar.set_postfix(loss=f"{value:.4f}", steps_s=f"{report.steps / (time.perf_counter() - start):.2f}")
            if report.steps % cfg.eval_every == 0:
                report.losses.append(sum(window) / len(window))
                window = []
                score = _agreement(kind, student, val, val_targets, device)
                if score > report.best_val_cosine:
                    report.best_val_cosine, report.best_step = score, report.steps
                    best_state = {k: v.detach().clone() for k, v in student.state_dict().items()}
    except KeyboardInterrupt:
        report.stopped = f"interrupted at step {report.steps}; kept the best weights"
    finally:
        bar.close()
    report.seconds = time.perf_counter() - start
    if not report.stopped:
        score = _agreement(kind, student, val, val_targets, device)
        if score > report.best_val_cosine:
            report.best_val_cosine, report.best_step = score, report.steps
            best_state = {k: v.detach().clone() for k, v in student.state_dict().items()}
    student.load_state_dict(best_state)
    for p in student.parameters():
        p.requires_grad_(False)
    student.to("cpu").eval()
    teacher.to("cpu")
