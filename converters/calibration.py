"""Calibration statistics: run the model on calibration text and collect, with forward hooks,
each targeted linear layer's input Gram matrix XᵀX (streamed over batches, float64, real tokens
only) and the token counts of the input embedding. Cached under the user's cache folder, keyed
on a hash of the weights, the texts and the layers.

On request also each layer's output sensitivity F = Σ_tokens E_z[g gᵀ], g = ∂(zᵀo)/∂y the gradient
at the layer output y of the model kind's random probes zᵀo of its output o, chosen so that E[z zᵀ]
is the Hessian of the kind's loss at o (an encoder: 1 − cos of the pooled embedding), so that
δyᵀ F δy ≈ 2 × the loss an error δy adds."""

import dataclasses
import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from tqdm.auto import tqdm

from compressor.dense import dense_weight
from compressor.errors import CompressorError
from converters.kinds import kind_of
from files.atomic import atomic_file, cache_dir
from texts.tokens import encode_passages

__all__ = [
    "Calibration",
    "calibrate",
    "cached_calibration",
    "statistics_bytes",
    "default_cache_dir",
    "token_counts",
    "MIN_CALIB_TOKENS",
]

MIN_CALIB_TOKENS = 64


@dataclass
class Calibration:
    grams: dict[str, Tensor]  # linear module name → XᵀX (in × in), float64
    counts: Tensor  # (V,) how often each token id occurred: int64, float64 once blended with a prior
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

    def with_prior(self, prior: Tensor, weight: float) -> "Calibration":
        """A copy whose counts are (1 − weight) c + weight N p (float64; N = Σ c): texts.prior's blend."""
        counts = self.counts.to(torch.float64)
        return dataclasses.replace(self, counts=(1 - weight) * counts + weight * counts.sum() * prior)

    def head_tokens(self, k: int) -> Tensor:
        """The k most frequent token ids, special tokens always among them (those the table has: a tokenizer's
        entries beyond it, EmbeddingGemma's image token, no text produces)."""
        counts = self.counts.clone().to(torch.float64)
        counts[[i for i in self.special_ids if i < len(counts)]] = float("inf")
        return torch.argsort(counts, descending=True, stable=True)[:k]


def _accumulate(store: dict[str, Tensor], name: str, rows: Tensor, scale: float = 1.0) -> None:
    """store[name] += scale · rowsᵀ rows, in place (float64)."""
    rows = rows.detach().to(torch.float64)
    if name not in store:
        store[name] = torch.zeros(rows.shape[1], rows.shape[1], dtype=torch.float64)
    store[name].addmm_(rows.T, rows, alpha=scale)


def statistics_bytes(model: nn.Module, linear_names: list[str], sensitivity: bool) -> int:
    """What calibrate() holds at most (layers reading one input share their Gram, which only lowers
    it): a float64 in × in Gram per layer, and with sensitivity an out × out matrix per layer and one for the table."""
    shapes = [dense_weight(model.get_submodule(n)).shape for n in linear_names]  # (out, in); Conv1D too
    grams = sum(cols**2 for _, cols in shapes)
    if sensitivity:
        grams += sum(rows**2 for rows, _ in shapes) + model.get_input_embeddings().embedding_dim ** 2
    return 8 * grams


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
    on_estimate: Callable[[float], None] | None = None,
) -> Calibration:
    """Forward the model over `texts`; Gram matrices of the inputs of `linear_names` (layers fed the
    same tensor, as query, key and value are, share one Gram object), and with `sensitivity` the output
    sensitivities of those layers and of the input embedding (a backward pass per probe of the model
    kind's output). `on_estimate(seconds)`: the whole pass's time, extrapolated from its first batch."""
    kind = kind_of(model)
    embedding = model.get_input_embeddings()
    vocab = embedding.num_embeddings
    embedding_name = next(n for n, m in model.named_modules() if m is embedding)
    grams: dict[str, Tensor] = {}
    sens: dict[str, Tensor] = {}
    current_mask: list[Tensor] = []  # the running batch's attention mask, read by the hooks
    first_batch = [True]

    def watch_output(name: str, output: Tensor) -> None:
        real = current_mask[0]
        output.register_hook(lambda g: _accumulate(sens, name, g[real], 1.0 / probes))

    shares: dict[str, str] = {}  # layer → the layer before it that read the same input tensor
    last_input: list = [None, None]  # the input tensor the previous hook saw, and its layer

    def gram_hook(name):
        def hook(module, inputs, output):
            x = inputs[0]
            if last_input[0] is x and first_batch[0]:
                shares[name] = shares.get(last_input[1], last_input[1])
            if name not in shares:
                _accumulate(grams, name, x[current_mask[0]])
            last_input[:] = [x, name]
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
        start = time.perf_counter()
        for feed in tqdm(
            encode_passages(tokenizer, texts, max_length, batch, tensors="pt"),
            total=steps,
            desc=desc,
            disable=not progress,
        ):
            ids, mask = feed["input_ids"], feed["attention_mask"]
            current_mask[:] = [mask.bool()]
            counts += torch.bincount(ids[mask.bool()], minlength=vocab)[:vocab]
            with torch.set_grad_enabled(sensitivity):
                output = kind.output(model, ids, mask)
                if sensitivity:
                    for i, probe in enumerate(kind.probes(output, mask, probes, generator)):
                        probe.backward(retain_graph=i < probes - 1)
            last_input[:] = [None, None]
            if first_batch[0] and on_estimate is not None:
                on_estimate((time.perf_counter() - start) * steps)
            first_batch[0] = False
    finally:
        for h in handles:
            h.remove()
        for p, flag in frozen.items():
            p.requires_grad_(flag)
    grams.update({name: grams[first] for name, first in shares.items()})
    calib = Calibration(grams, counts, tuple(tokenizer.all_special_ids), sens)
    if calib.tokens < MIN_CALIB_TOKENS:
        raise CompressorError(f"calibration text has {calib.tokens} tokens; at least {MIN_CALIB_TOKENS} are needed")
    return calib


def token_counts(tokenizer, texts: list[str], vocab: int, max_length: int = 128) -> Tensor:
    """(vocab,) int64: how often each token id occurs in `texts`, each cut to `max_length` tokens as
    calibrate() cuts them (tokenizing alone: cheap enough for every passage of a text)."""
    ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    flat = torch.as_tensor([i for row in ids for i in row], dtype=torch.long)
    return torch.bincount(flat, minlength=vocab)[:vocab]


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/compressor, else ~/.cache/compressor (where the default text is cached too)."""
    return cache_dir()


def _key(model: nn.Module, texts: list[str], linear_names: list[str], max_length: int) -> str:
    """A hash of the weights (names, dtypes, shapes, bytes), the layers, the length and the texts."""
    h = hashlib.sha256()
    h.update(json.dumps([sorted(linear_names), max_length]).encode())
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    for t in texts:
        h.update(t.encode() + b"\0")
    return h.hexdigest()[:16]


SENSITIVITY_PREFIX = "__sensitivity__."


def _read(path: Path) -> Calibration | None:
    """The calibration cached in `path`; a file that does not load is said, removed, and a miss."""
    try:
        with safe_open(str(path), framework="pt") as f:
            special = tuple(json.loads(f.metadata()["special_ids"]))
            shares = json.loads(f.metadata().get("shares", "{}"))
        data = load_file(path)
        counts = data.pop("__counts__")
        data.update({name: data[first] for name, first in shares.items()})
    except (SafetensorError, OSError, KeyError, TypeError, ValueError) as e:
        print(
            f"compressor: the calibration cache {path} is damaged ({e}); removed, computing it again", file=sys.stderr
        )
        path.unlink(missing_ok=True)
        return None
    sens = {k[len(SENSITIVITY_PREFIX) :]: data.pop(k) for k in list(data) if k.startswith(SENSITIVITY_PREFIX)}
    return Calibration(data, counts, special, sens)


def cached_calibration(
    cache_dir: Path | None,
    model: nn.Module,
    tokenizer,
    texts: list[str],
    linear_names: list[str],
    max_length: int = 128,
    progress: bool = True,
    sensitivity: bool = False,
    on_estimate: Callable[[float], None] | None = None,
) -> Calibration:
    """calibrate(...), read from `cache_dir` when the same weights, text and layers were seen (a
    calibration with sensitivities serves a request without them too); None: no cache."""
    options = {"progress": progress, "sensitivity": sensitivity, "on_estimate": on_estimate}
    if cache_dir is None:
        return calibrate(model, tokenizer, texts, linear_names, max_length, **options)
    key = _key(model, texts, linear_names, max_length)
    with_sens = Path(cache_dir) / f"calibration-{key}-sensitivity.safetensors"
    plain = Path(cache_dir) / f"calibration-{key}.safetensors"
    for path in [with_sens] if sensitivity else [plain, with_sens]:
        if path.is_file() and (cached := _read(path)) is not None:
            return cached
    calib = calibrate(model, tokenizer, texts, linear_names, max_length, **options)
    firsts: dict[int, str] = {}
    shares = {k: firsts.setdefault(id(v), k) for k, v in calib.grams.items() if firsts.setdefault(id(v), k) != k}
    tensors = {
        **{k: v.contiguous() for k, v in calib.grams.items() if k not in shares},
        **{SENSITIVITY_PREFIX + k: v.contiguous() for k, v in calib.sensitivities.items()},
        "__counts__": calib.counts,
    }
    metadata = {"special_ids": json.dumps(list(calib.special_ids)), "shares": json.dumps(shares)}
    try:
        with atomic_file(with_sens if sensitivity else plain) as tmp:
            save_file(tensors, str(tmp), metadata=metadata)
    except (OSError, SafetensorError, CompressorError) as e:  # an unwritable cache costs a recomputation only
        print(f"compressor: warning: the calibration was not cached: {e}", file=sys.stderr)
    return calib
