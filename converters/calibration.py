"""Calibration statistics: run the model on calibration text and collect, with forward hooks,
each targeted linear layer's input Gram matrix XᵀX (streamed over batches, float64, real tokens
only) and the token counts of the input embedding. Cached by content hash.

On request also each layer's output sensitivity F = Σ_tokens E_z[g gᵀ], g = ∂(zᵀe)/∂y the gradient
at the layer output y of a random probe of the pooled embedding e, z = (I − êêᵀ) u / ‖e‖, u ~ N(0, I):
E[z zᵀ] is the Hessian of 1 − cos(e, e') at e' = e, so δyᵀ F δy ≈ 2 × the loss an error δy adds."""

import hashlib
import json
from dataclasses import dataclass, field
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
    sensitivities: dict[str, Tensor] = field(default_factory=dict)  # module name → F (out × out), float64

    @property
    def tokens(self) -> int:
        """Real (unpadded) tokens seen."""
        return int(self.counts.sum())

    def gram(self, name: str) -> Tensor:
        if name not in self.grams:
            raise CompressorError(f"calibration has no statistics for {name!r}; it covered {sorted(self.grams)[:3]}…")
        return self.grams[name]

    def sensitivity(self, name: str) -> Tensor:
        if name not in self.sensitivities:
            raise CompressorError(f"calibration has no output sensitivity for {name!r}; calibrate with sensitivity")
        return self.sensitivities[name]


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


def _accumulate(store: dict[str, Tensor], name: str, rows: Tensor, scale: float = 1.0) -> None:
    rows = rows.detach().to(torch.float64)
    store[name] = store.get(name, 0) + scale * (rows.T @ rows)


def _pooled_probes(hidden: Tensor, mask: Tensor, probes: int, generator: torch.Generator) -> list[Tensor]:
    """`probes` scalars zᵀe over the batch, e the mean-pooled embedding, z = (I − êêᵀ) u / ‖e‖."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    e = (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)  # (B, H)
    norm = e.detach().norm(dim=-1, keepdim=True).clamp_min(1e-12)
    unit = e.detach() / norm
    out = []
    for _ in range(probes):
        u = torch.randn(e.shape, generator=generator, dtype=e.dtype)
        out.append(((u - unit * (unit * u).sum(-1, keepdim=True)) / norm * e).sum())
    return out


def calibrate(
    model: nn.Module,
    tokenizer,
    texts: list[str],
    linear_names: list[str],
    max_length: int = 128,
    batch: int = 16,
    progress: bool = True,
    sensitivity: bool = False,
    probes: int = 2,
) -> Calibration:
    """Forward the model over `texts`; Gram matrices of the inputs of `linear_names`, and with
    `sensitivity` the output sensitivities of those layers and of the input embedding (a backward
    pass per probe)."""
    embedding = model.get_input_embeddings()
    vocab = embedding.num_embeddings
    embedding_name = next(n for n, m in model.named_modules() if m is embedding)
    grams: dict[str, Tensor] = {}
    sens: dict[str, Tensor] = {}
    current_mask: list[Tensor] = []  # the running batch's attention mask, read by the hooks

    def watch_output(name: str, output: Tensor) -> None:
        real = current_mask[0]
        output.register_hook(lambda g: _accumulate(sens, name, g[real], 1.0 / probes))

    def gram_hook(name):
        def hook(module, inputs, output):
            _accumulate(grams, name, inputs[0][current_mask[0]])
            if sensitivity:
                watch_output(name, output)

        return hook

    def embedding_hook(module, inputs, output):
        output.requires_grad_(True)  # the root of the probes' backward pass
        watch_output(embedding_name, output)

    handles = [model.get_submodule(n).register_forward_hook(gram_hook(n)) for n in linear_names]
    if sensitivity:
        handles.append(embedding.register_forward_hook(embedding_hook))
    frozen = {p: p.requires_grad for p in model.parameters()}
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(vocab, dtype=torch.long)
    try:
        for p in frozen:
            p.requires_grad_(False)
        steps = (len(texts) + batch - 1) // batch
        desc = "calibrate (with sensitivity)" if sensitivity else "calibrate"
        for ids, mask in tqdm(
            _batches(tokenizer, texts, max_length, batch), total=steps, desc=desc, disable=not progress
        ):
            current_mask[:] = [mask.bool()]
            counts += torch.bincount(ids[mask.bool()], minlength=vocab)[:vocab]
            with torch.set_grad_enabled(sensitivity):
                hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
                if sensitivity:
                    for i, probe in enumerate(_pooled_probes(hidden, mask, probes, generator)):
                        probe.backward(retain_graph=i < probes - 1)
    finally:
        for h in handles:
            h.remove()
        for p, flag in frozen.items():
            p.requires_grad_(flag)
    calib = Calibration(grams, counts, tuple(tokenizer.all_special_ids), sens)
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


SENSITIVITY_PREFIX = "__sensitivity__."


def cached_calibration(
    cache_dir: Path,
    model_dir: Path,
    model: nn.Module,
    tokenizer,
    texts: list[str],
    linear_names: list[str],
    max_length: int = 128,
    progress: bool = True,
    sensitivity: bool = False,
) -> Calibration:
    """calibrate(...), read from `cache_dir` when the same model, text and layers were seen (a
    calibration with sensitivities serves a request without them too)."""
    key = _key(model_dir, texts, linear_names, max_length)
    with_sens = Path(cache_dir) / f"calibration-{key}-sensitivity.safetensors"
    plain = Path(cache_dir) / f"calibration-{key}.safetensors"
    for path in [with_sens] if sensitivity else [plain, with_sens]:
        if path.is_file():
            with safe_open(str(path), framework="pt") as f:
                special = tuple(json.loads(f.metadata()["special_ids"]))
            data = load_file(path)
            counts = data.pop("__counts__")
            sens = {k[len(SENSITIVITY_PREFIX) :]: data.pop(k) for k in list(data) if k.startswith(SENSITIVITY_PREFIX)}
            return Calibration(data, counts, special, sens)
    calib = calibrate(model, tokenizer, texts, linear_names, max_length, progress=progress, sensitivity=sensitivity)
    tensors = {
        **{k: v.contiguous() for k, v in calib.grams.items()},
        **{SENSITIVITY_PREFIX + k: v.contiguous() for k, v in calib.sensitivities.items()},
        "__counts__": calib.counts,
    }
    with atomic_file(with_sens if sensitivity else plain) as tmp:
        save_file(tensors, str(tmp), metadata={"special_ids": json.dumps(list(calib.special_ids))})
    return calib
