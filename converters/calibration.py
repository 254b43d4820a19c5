"""Calibration statistics: run the model on calibration text and collect, with forward hooks,
each targeted linear layer's input Gram matrix XᵀX (streamed over batches, float64, real tokens
only) and the token counts of the input embedding. Cached by content hash."""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from tqdm.auto import tqdm

from compressor.errors import CompressorError
from converters.atomic import atomic_file

__all__ = ["Calibration", "calibrate", "cached_calibration", "MIN_CALIB_TOKENS"]

MIN_CALIB_TOKENS = 64


@dataclass
class Calibration:
    grams: dict[str, Tensor]  # linear module name → XᵀX (in × in), float64
    counts: Tensor  # (V,) how often each token id occurred, int64
    special_ids: tuple[int, ...] = ()  # the tokenizer's special tokens ([CLS], [SEP], …)

    @property
    def tokens(self) -> int:
        """Real (unpadded) tokens seen."""
        return int(self.counts.sum())

    def gram(self, name: str) -> Tensor:
        if name not in self.grams:
            raise CompressorError(f"calibration has no statistics for {name!r}; it covered {sorted(self.grams)[:3]}…")
        return self.grams[name]


def _batches(tokenizer, texts: list[str], max_length: int, batch: int):
    for start in range(0, len(texts), batch):
        enc = tokenizer(
            texts[start : start + batch],
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )
        yield enc["input_ids"], enc["attention_mask"]


@torch.no_grad()
def calibrate(
    model: nn.Module,
    tokenizer,
    texts: list[str],
    linear_names: list[str],
    max_length: int = 128,
    batch: int = 16,
    progress: bool = True,
) -> Calibration:
    """Forward the model over `texts`; Gram matrices of the inputs of `linear_names`."""
    vocab = model.get_input_embeddings().num_embeddings
    grams: dict[str, Tensor] = {}
    current_mask: list[Tensor] = []  # the running batch's attention mask, read by the hooks

    def hook(name):
        def accumulate(module, inputs, output):
            x = inputs[0][current_mask[0]].to(torch.float64)  # (real tokens, in)
            grams[name] = grams.get(name, 0) + x.T @ x

        return accumulate

    handles = [model.get_submodule(n).register_forward_hook(hook(n)) for n in linear_names]
    counts = torch.zeros(vocab, dtype=torch.long)
    try:
        steps = (len(texts) + batch - 1) // batch
        for ids, mask in tqdm(
            _batches(tokenizer, texts, max_length, batch), total=steps, desc="calibrate", disable=not progress
        ):
            current_mask[:] = [mask.bool()]
            counts += torch.bincount(ids[mask.bool()], minlength=vocab)[:vocab]
            model(input_ids=ids, attention_mask=mask)
    finally:
        for h in handles:
            h.remove()
    calib = Calibration(grams, counts, tuple(tokenizer.all_special_ids))
    if calib.tokens < MIN_CALIB_TOKENS:
        raise CompressorError(f"calibration text has {calib.tokens} tokens; at least {MIN_CALIB_TOKENS} are needed")
    return calib


def _key(model_dir: Path, texts: list[str], linear_names: list[str], max_length: int) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([str(Path(model_dir).resolve()), sorted(linear_names), max_length]).encode())
    h.update((model_dir / "config.json").read_bytes() if (model_dir / "config.json").is_file() else b"")
    for t in texts:
        h.update(t.encode() + b"\0")
    return h.hexdigest()[:16]


def cached_calibration(
    cache_dir: Path,
    model_dir: Path,
    model: nn.Module,
    tokenizer,
    texts: list[str],
    linear_names: list[str],
    max_length: int = 128,
    progress: bool = True,
) -> Calibration:
    """calibrate(...), read from `cache_dir` when the same model, text and layers were seen."""
    path = Path(cache_dir) / f"calibration-{_key(model_dir, texts, linear_names, max_length)}.safetensors"
    if path.is_file():
        with safe_open(str(path), framework="pt") as f:
            special = tuple(json.loads(f.metadata()["special_ids"]))
        data = load_file(path)
        counts = data.pop("__counts__")
        return Calibration(data, counts, special)
    calib = calibrate(model, tokenizer, texts, linear_names, max_length, progress=progress)
    with atomic_file(path) as tmp:
        tensors = {**{k: v.contiguous() for k, v in calib.grams.items()}, "__counts__": calib.counts}
        save_file(tensors, str(tmp), metadata={"special_ids": json.dumps(list(calib.special_ids))})
    return calib
