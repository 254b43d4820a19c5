"""finetune_(Distillation(student, teacher, ...), cfg): distil the original model into its compressed copy.

The loss per batch is the model kind's on the outputs (an encoder: (1 − cos(pool(h_s), pool(h_t)))
· w_cos + ‖h_s − h_t‖² / ‖h_t‖² · w_hidden over real tokens, pool = mean over real tokens) plus
per-layer matching, w_layer · mean_l ‖h_s^l − h_t^l‖² / ‖h_t^l‖² over every layer's hidden state
(the embedding's output first), which gives every compressed layer its own signal. The teacher runs
alongside on each batch (a broad text is never seen twice in a budget, so nothing is cached).

Batches are drawn at random from the text's windows, a share of them weighted towards rare tokens
(window i weighs Σ over its distinct tokens t of 1 / count(t)), and optionally completed with token
sequences drawn from a general-English prior (texts.prior), so that tokens the text lacks are
trained too. AdamW: compressed tables at `lr`, compressed linear layers at `linear_lr` (factors of
a linear layer want a step ~10× smaller than a table's rows), the other parameters (trainable
"all") at `rest_lr`; the rate warms up, then decays linearly to 0 at the end of the step or time
budget. The student runs without dropout, as the teacher does. `cuda` with bf16 autocast when
present, else the CPU with all cores (the thread setting restored after); the best weights by the
kind's agreement on a held-out validation split are kept. With a state file the fine-tune saves its
state every `eval_every` steps and when stopped (Ctrl-C, SIGTERM), and `resume` goes on from it to
the result of the same run unstopped (converters.finetune.state)."""

import contextlib
import copy
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from compressor.compact_embedding import CompactEmbedding
from compressor.errors import CompressorError
from compressor.tied_logits import TiedLogits
from converters.distributed import (
    SHARD_ALONE,
    agree_to_stop,
    check_shares,
    full_weights,
    process_group,
    shard,
    world,
    wrap,
)
from converters.finetune.config import FinetuneConfig, FinetuneReport
from converters.finetune.data import batches, pad, synthetic_windows, window_weights, windows
from converters.finetune.loss import agreement, step_loss, validation_targets
from converters.finetune.state import load_state, save_state
from converters.kinds import kind_of

__all__ = ["Distillation", "FinetuneRun", "finetune_", "trainable_parameters", "pick_device"]


@dataclass(frozen=True)
class Distillation:
    """What a fine-tune distils: `teacher` into `student` (in place) on the passages `texts`, its best weights kept
    by agreement on `val_texts`, both read by `tokenizer`; `compact_types`: the compact modules whose parameters
    train; `prior` (V,): the token distribution synthetic sequences are drawn from (cfg.synthetic)."""

    student: nn.Module
    teacher: nn.Module
    tokenizer: Any
    texts: list[str]
    val_texts: list[str]
    compact_types: tuple[type, ...]
    prior: Tensor | None = None


@dataclass(frozen=True)
class FinetuneRun:
    """How a fine-tune runs: on `device` (None: the config's), with a progress bar, its state saved to `state`
    (None: not saved) and, with `resume`, going on from it; `on_eval(step, agreement, student)` called at each
    validation (a recovery curve's measures); `sharded`: under torchrun, student and teacher sharded over the
    processes by FSDP instead of a whole student on each (DistributedDataParallel)."""

    device: torch.device | None = None
    progress: bool = True
    state: Path | None = None
    resume: bool = False
    on_eval: Callable[[int, float, nn.Module], None] | None = None
    sharded: bool = False


@dataclass(frozen=True)
class _Start:
    """Where the loop starts: the model kind, the device, the text's windows it draws from, and the state resumed
    (None: a fresh start)."""

    kind: Any
    device: torch.device
    pool: list[list[int]]
    saved: dict | None


def pick_device(asked: str = "auto") -> torch.device:
    """cuda when asked or, with "auto", when present (under torchrun the process's own GPU), else the CPU."""
    gpu = asked == "cuda" or (asked == "auto" and torch.cuda.is_available())
    return torch.device("cuda", world().local_rank) if gpu else torch.device("cpu")


def trainable_parameters(
    student: nn.Module, which: str, compact_types: tuple[type, ...]
) -> tuple[list[nn.Parameter], list[nn.Parameter], list[nn.Parameter]]:
    """(the compact tables' parameters and, with "all", a dense table a tied head shares, the other
    compact modules', the rest if `which` is "all"), everything else frozen."""
    tied = [m.embedding for m in student.modules() if isinstance(m, TiedLogits)]
    table_modules = [m for m in student.modules() if isinstance(m, CompactEmbedding) or any(m is t for t in tied)]
    tables = {id(p) for m in table_modules for p in m.parameters()}
    compact = {id(p) for m in student.modules() if isinstance(m, compact_types) for p in m.parameters()}
    groups: tuple[list[nn.Parameter], ...] = ([], [], [])
    for p in student.parameters():
        p.requires_grad_(which == "all" or id(p) in compact)
        if p.requires_grad:
            groups[0 if id(p) in tables else 1 if id(p) in compact else 2].append(p)
    if not groups[0] and not groups[1] and which == "compressed":
        raise CompressorError("the model has no compressed modules to train; use trainable='all'")
    return groups


def _lr_factor(cfg: FinetuneConfig, step: int, elapsed: float) -> float:
    """Multiplier of the learning rate at `step` (0-based) after `elapsed` seconds: 1 when constant;
    linear: min(1, (step+1)/warmup) · (1 − progress), progress the larger spent fraction of the budgets."""
    if cfg.schedule == "constant":
        return 1.0
    spent = [step / cfg.steps] if cfg.steps else []
    spent += [elapsed / cfg.seconds] if cfg.seconds else []
    return min(1.0, (step + 1) / max(cfg.warmup_steps, 1)) * max(0.0, 1.0 - max(spent))


@contextlib.contextmanager
def _stop_on_sigterm():
    """SIGTERM (a scheduler's stop) stops the fine-tune as Ctrl-C does: its state saved, its best weights kept."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


@contextlib.contextmanager
def _threads(device: torch.device):
    """All cores for a CPU fine-tune, shared by torchrun's processes, the process's setting restored after."""
    before = torch.get_num_threads()
    wanted = max(1, (os.cpu_count() or 1) // world().size) if device.type == "cpu" else before
    if wanted != before:  # each call re-makes the thread pools (and upsets MKL's batched LU: compressor/tt.py)
        torch.set_num_threads(wanted)
    try:
        yield
    finally:
        if wanted != before:
            torch.set_num_threads(before)


def _teacher_on(teacher: nn.Module, device: torch.device) -> nn.Module:
    """The teacher to run on `device`: on a GPU a bf16 copy (half the memory; the student runs in bf16
    autocast), on the CPU itself in float32."""
    if device.type == "cpu":
        return teacher.eval()
    return copy.deepcopy(teacher).to(device, torch.bfloat16).eval()


def finetune_(job: Distillation, cfg: FinetuneConfig, run: FinetuneRun = FinetuneRun()) -> FinetuneReport:
    """Train `job.student` in place to match `job.teacher` by `cfg` (and, with cfg.synthetic, on token sequences
    drawn from `job.prior`); keep its best weights by agreement on `job.val_texts`. Returns what happened (steps,
    time, losses, why it stopped)."""
    if not job.texts:
        raise CompressorError("no fine-tune text: give a file with at least one passage")
    if not job.val_texts:
        raise CompressorError("no validation text for the fine-tune")
    if cfg.synthetic > 0 and job.prior is None:
        raise CompressorError("a fine-tune with synthetic sequences needs a token prior to draw them from")
    if run.resume and run.state is None:
        raise CompressorError("--resume goes on from a fine-tune state: give its file")
    if run.state is not None and world().size > 1:
        raise CompressorError("a fine-tune state is saved by one process: run --state and --resume without torchrun")
    if run.sharded and world().size == 1:
        raise CompressorError(SHARD_ALONE)
    device = run.device or pick_device(cfg.device)
    report = FinetuneReport(device=str(device))
    if cfg.steps == 0:
        report.stopped = "0 steps asked: skipped"
        return report
    kind = kind_of(job.student)
    cfg = cfg.with_batch(kind)
    check_shares(cfg.batch_size, "windows in a batch")
    pool = windows(job.tokenizer, job.texts, cfg.max_length)  # what each step draws from
    check_shares(len(pool), "windows in the fine-tune text")
    saved = load_state(run.state, cfg, job.student) if run.resume else None  # a wrong state fails before any work
    with process_group(device), _threads(device), _stop_on_sigterm():
        _train(job, cfg, run, _Start(kind, device, pool, saved), report)
    return report


def _kept(scored: nn.Module, moving: set[str]) -> dict[str, Tensor]:
    """A copy of the weights of `scored` that train (`moving`), the best so far: the frozen rest never changes (an
    int4-trained student's rounded weights are as large as its model)."""
    return {k: v.detach().clone() for k, v in scored.state_dict().items() if k in moving}


def _train(job: Distillation, cfg: FinetuneConfig, run: FinetuneRun, start_at: _Start, report: FinetuneReport) -> None:
    """The loop of finetune_, from `start_at`, its steps and scores in `report`."""
    kind, device, pool, saved = start_at.kind, start_at.device, start_at.pool, start_at.saved
    student, teacher, tokenizer, path, sharded = job.student, job.teacher, job.tokenizer, run.state, run.sharded
    here = world()  # under torchrun each process draws its share of a batch; rank 0 evaluates and logs
    torch.manual_seed(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed + here.rank)
    if sharded:  # FSDP places each process's shards on its device; the whole models stay on the CPU
        source = shard(teacher.eval().requires_grad_(False), device)
    else:
        source = _teacher_on(teacher, device)
        student.to(device)
    weights = window_weights(pool, cfg.rare_share)
    made = round(cfg.synthetic * cfg.batch_size) // here.size  # synthetic windows per batch
    drawn = max(1, min(cfg.batch_size // here.size - made, len(pool)))
    val = batches(tokenizer, job.val_texts, cfg)
    evaluates = here.main or sharded  # FSDP's blocks run on all processes together
    val_targets = validation_targets(kind, source, val, device) if evaluates else None
    groups = trainable_parameters(student, cfg.trainable, job.compact_types)
    report.trainable_params = sum(p.numel() for ps in groups for p in ps)
    trained = wrap(student, device, sharded)  # DistributedDataParallel or FSDP under torchrun
    scored = trained if sharded else student  # what validation runs
    moving = {name for name, p in scored.named_parameters() if p.requires_grad}  # what the best weights keep
    if sharded:  # the optimizer steps the shards
        names = {id(p): n for n, p in student.named_parameters()}
        own = dict(trained.module.named_parameters())
        groups = tuple([own[names[id(p)]] for p in ps] for ps in groups)
    rates = (cfg.lr, cfg.linear_lr, cfg.rest_lr)
    optimizer = torch.optim.AdamW([{"params": ps, "lr": r} for ps, r in zip(groups, rates) if ps], weight_decay=0.0)
    for group in optimizer.param_groups:
        group["initial_lr"] = group["lr"]
    window: list[float] = []
    spent = 0.0
    if saved is None:
        best_state = _kept(scored, moving)
        if evaluates:
            report.start_val_cosine = report.best_val_cosine = agreement(kind, scored, val, val_targets, device)
    else:
        student.load_state_dict(saved["student"])
        optimizer.load_state_dict(saved["optimizer"])
        generator.set_state(saved["generator"])
        torch.set_rng_state(saved["torch_rng"])
        best_state, window, spent = saved["best"], saved["window"], saved["seconds"]
        report.steps, report.losses, report.best_step = saved["step"], saved["losses"], saved["best_step"]
        report.tokens = saved["tokens"]
        report.start_val_cosine, report.best_val_cosine = saved["start_val"], saved["best_val"]

    def save(drawn_from: Tensor) -> None:
        """The state after report.steps steps; `drawn_from`: the sampler's state before the next step's draw."""
        if path is None:
            return
        fields = {
            "step": report.steps,
            "seconds": time.perf_counter() - start,
            "student": student.state_dict(),
            "optimizer": optimizer.state_dict(),
            "generator": drawn_from,
            "torch_rng": torch.get_rng_state(),
            "best": best_state,
            "best_step": report.best_step,
            "start_val": report.start_val_cosine,
            "best_val": report.best_val_cosine,
            "losses": report.losses,
            "window": window,
            "tokens": report.tokens,
        }
        save_state(path, cfg, student, fields)

    start = time.perf_counter() - spent
    before_draw = generator.get_state()
    show = run.progress and here.main
    bar = tqdm(total=cfg.steps, initial=report.steps, desc="fine-tune", disable=not show, unit="step")
    try:
        while True:
            elapsed = time.perf_counter() - start
            spent_all = (cfg.steps is not None and report.steps >= cfg.steps) or (
                cfg.seconds is not None and elapsed >= cfg.seconds
            )
            if agree_to_stop(spent_all, device):
                break
            before_draw = generator.get_state()  # a stop within this step saves the state before it
            picked = [pool[i] for i in torch.multinomial(weights, drawn, generator=generator).tolist()]
            if made:
                picked += synthetic_windows(tokenizer, job.prior, made, cfg.max_length, generator)
            ids, mask = (t.to(device) for t in pad(tokenizer, picked))
            report.tokens += int(mask.sum()) * here.size
            loss = step_loss(kind, trained, source, ids, mask, cfg)
            value = float(loss.detach())
            if agree_to_stop(not math.isfinite(value), device):
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
            if report.steps % cfg.eval_every == 0 and evaluates:
                report.losses.append(sum(window) / len(window))
                window = []
                score = agreement(kind, scored, val, val_targets, device)
                if score > report.best_val_cosine:
                    report.best_val_cosine, report.best_step = score, report.steps
                    best_state = _kept(scored, moving)
                if run.on_eval is not None:
                    run.on_eval(report.steps, score, scored)
                save(generator.get_state())
    except KeyboardInterrupt:
        save(before_draw)
        resumable = f", saved its state to {str(path)!r} (--resume goes on)" if path is not None else ""
        report.stopped = f"interrupted at step {report.steps}; kept the best weights{resumable}"
    finally:
        bar.close()
    report.seconds = time.perf_counter() - start
    if not report.stopped and evaluates:
        score = agreement(kind, scored, val, val_targets, device)
        if score > report.best_val_cosine:
            report.best_val_cosine, report.best_step = score, report.steps
            best_state = _kept(scored, moving)
    if evaluates:  # under DistributedDataParallel the others hold the last step's weights, shared with it
        scored.load_state_dict(best_state, strict=False)
    if sharded:
        student.load_state_dict(full_weights(trained))
    for p in student.parameters():
        p.requires_grad_(False)
    student.to("cpu").eval()
    teacher.to("cpu")
