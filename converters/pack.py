"""What a machine without network needs to fine-tune a compressed checkpoint there (a GPU lent for
minutes, reached by copying at most PACK_LIMIT bytes): the original model in bf16 safetensors with its
config and tokenizer, the plan, the calibration and fine-tune texts, the token-frequency prior (saved: the
machine may lack wordfreq), the project's own wheel (and any other the machine lacks), and `run.sh`, which
installs the wheels, compresses the original by the plan there and fine-tunes it, writing the checkpoint
under $OUT. The student is made there rather than carried: the original in bf16 and a plan are smaller
than both models."""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from compressor.errors import CompressorError
from converters.checkpoint import load_model, read_meta
from converters.kinds import kind_named
from files.atomic import atomic_dir
from files.model_folder import copy_source_files
from texts.prior import save_prior, token_prior
from texts.tokens import load_tokenizer

__all__ = ["PACK_LIMIT", "RUN_SCRIPT", "pack_finetune", "folder_bytes"]

PACK_LIMIT = 64 * 2**20  # what the device machine takes with a command
RUN_SCRIPT = """#!/bin/sh
# Fine-tune the packed plan on this machine: install, compress the original, distil; the checkpoint
# goes to $OUT/checkpoint (default ./out). SECONDS_BUDGET: the fine-tune's time (default {seconds:g}).
set -e
cd "$(dirname "$0")"
OUT="${{OUT:-out}}"
python -m pip install --quiet --no-deps --no-index wheels/*.whl
compressor compress original --plan plan.json --calib calib.txt --freq-prior prior.safetensors --out "$OUT/checkpoint"
compressor finetune "$OUT/checkpoint" --data finetune.txt --time "${{SECONDS_BUDGET:-{seconds:g}}}"
"""
PROJECT = Path(__file__).resolve().parents[1]  # where pyproject.toml is, for the project's wheel
PACKAGES = ("compressor", "converters", "eval", "files", "texts")  # pyproject.toml's packages.find


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def _write_original(source: Path, folder: Path) -> int:
    """The original's weights in bf16 safetensors beside its config and tokenizer files; its vocabulary's size."""
    model, _ = load_model(source)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    folder.mkdir(parents=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    copy_source_files(source, folder)
    return model.get_input_embeddings().num_embeddings


def _source_copy(work: Path) -> Path:
    """The project's sources (pyproject.toml, README.md, its packages) copied under `work`, so that building
    its wheel leaves nothing (build/, *.egg-info) in the user's checkout."""
    copy = work / "source"
    copy.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(PROJECT / name, copy / name)
    for package in PACKAGES:
        shutil.copytree(PROJECT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _wheels(folder: Path, extra: list[str]) -> None:
    """The project's wheel, built from a copy of its sources, and those of `extra` (requirement strings)
    from this machine's index."""
    folder.mkdir()
    pip = [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory() as work:
        source = _source_copy(Path(work))
        commands = [[*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", str(source), "-w", str(folder)]]
        if extra:
            commands.append([*pip, "download", "--quiet", "--no-deps", *extra, "-d", str(folder)])
        for command in commands:
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                last = (done.stderr.strip().splitlines() or ["no message"])[-1]
                raise CompressorError(f"pip {command[3]} for the pack failed: {last}")


def pack_finetune(
    checkpoint: Path, out: Path, seconds: float, extra_wheels: list[str] = (), limit: int = PACK_LIMIT
) -> int:
    """Write the pack of `checkpoint`'s fine-tune to the new folder `out` (whole or not at all); its bytes."""
    if Path(out).exists() and not (Path(out) / "run.sh").is_file():  # a pack is replaced whole, nothing else
        raise CompressorError(f"{str(out)!r} is there and is not a pack; give a new folder")
    if not (PROJECT / "pyproject.toml").is_file():
        raise CompressorError("compressor pack builds the project's wheel from its source checkout; run it from one")
    meta = read_meta(checkpoint)
    source = Path(meta["source"])
    if not (source / "config.json").is_file():
        raise CompressorError(f"the original model {str(source)!r} of {str(checkpoint)!r} cannot be found")
    graph = kind_named(meta.get("kind", "encoder")).graph
    calib, _ = graph.passages(None, "calib")
    tune, _ = graph.passages(None, "finetune", minimum=2)
    with atomic_dir(Path(out)) as tmp:
        vocab = _write_original(source, tmp / "original")
        save_prior(tmp / "prior.safetensors", token_prior(load_tokenizer(source), vocab))
        (tmp / "plan.json").write_text(json.dumps(meta["plan"], indent=1))
        (tmp / "calib.txt").write_text("\n".join(p.replace("\n", " ") for p in calib[:1024]) + "\n")
        (tmp / "finetune.txt").write_text("\n".join(p.replace("\n", " ") for p in tune) + "\n")
        _wheels(tmp / "wheels", list(extra_wheels))
        (tmp / "run.sh").write_text(RUN_SCRIPT.format(seconds=seconds))
        (tmp / "run.sh").chmod(0o755)
        size = folder_bytes(tmp)
        if size > limit:
            raise CompressorError(
                f"the pack would be {size / 2**20:.1f} MiB, above the {limit / 2**20:.0f} MiB a device call takes"
            )
    return size
