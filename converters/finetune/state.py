"""A fine-tune's state on disk, so that a stopped fine-tune goes on where it stopped.

The state is everything the next step depends on: the student's weights, AdamW's moments, the step
and the seconds spent (the schedule reads both), the batch sampler's and PyTorch's random states, the
best weights and scores so far, the losses. It is written whole or not at all (files.atomic) every
`eval_every` steps and when the fine-tune is stopped (Ctrl-C, SIGTERM), and read with
`weights_only=True`. A state belongs to one fine-tune: the same config (budgets included) and a
student with the same parameters, else it is refused."""

import pickle
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from compressor.errors import CompressorError
from files.atomic import atomic_file

__all__ = ["STATE_VERSION", "save_state", "load_state", "check_resumable"]

STATE_VERSION = 2  # 2: the tokens trained on


def _shapes(student: nn.Module) -> dict[str, list[int]]:
    return {name: list(t.shape) for name, t in student.state_dict().items()}


def save_state(path: Path, cfg, student: nn.Module, fields: dict) -> None:
    """Write the state of `student`'s fine-tune under `cfg` (its `fields`: step, optimizer, …) to `path`."""
    state = {"version": STATE_VERSION, "config": asdict(cfg), "shapes": _shapes(student), **fields}
    with atomic_file(Path(path)) as tmp:
        torch.save(state, tmp)


def check_resumable(path: Path) -> None:
    """One sentence unless `path` is a file to resume from (before any work)."""
    if not Path(path).is_file():
        raise CompressorError(f"--resume: no fine-tune state at {str(path)!r}")


def load_state(path: Path, cfg, student: nn.Module) -> dict:
    """The state at `path`, checked to be a whole state of this fine-tune (`cfg`, `student`'s parameters)."""
    check_resumable(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (EOFError, RuntimeError, pickle.UnpicklingError, ValueError) as e:
        raise CompressorError(f"{str(path)!r} is not a whole fine-tune state (cut short?): {e}") from None
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise CompressorError(f"{str(path)!r} is not a fine-tune state of this version of compressor")
    if state["shapes"] != _shapes(student):
        raise CompressorError(f"{str(path)!r} is the state of another model or plan: its parameters differ")
    saved, now = state["config"], asdict(cfg)
    changed = sorted(k for k in now if saved.get(k) != now[k])
    if changed:
        diffs = ", ".join(f"{k} {saved.get(k)!r} there, {now[k]!r} here" for k in changed)
        raise CompressorError(f"{str(path)!r} is the state of a fine-tune with other settings: {diffs}")
    return state
