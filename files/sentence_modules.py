"""A sentence-transformers folder's modules (its modules.json), read and checked: the Transformer at the folder's
root (the model the toolkit exports), then a Pooling, Dense layers and a Normalize, which turn its last_hidden_state
into the sentence embedding (eval.embedding computes them as sentence-transformers does). Any other module, or these
in another order, is refused in one sentence that names it; a Dense layer's weights are read from its safetensors
file (float32, float16 or bfloat16), never from a pickle."""

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compressor.errors import CompressorError

__all__ = ["Dense", "SentenceModules", "POOLING_MODES", "sentence_modules"]

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
LEGACY_MODES = {  # the flags of older Pooling configs
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
ACTIVATIONS = {"torch.nn.modules.linear.Identity": False, "torch.nn.modules.activation.Tanh": True}  # → tanh
SENTENCE = "sentence_embedding"  # the feature Pooling writes and Dense and Normalize read
TAKEN = "a Transformer at the folder's root, then a Pooling, Dense layers and a Normalize, in that order"


@dataclass(frozen=True)
class Dense:
    """y = act(W x + b): `weight` (out, in), `bias` (out,) or None, act tanh or the identity."""

    weight: np.ndarray
    bias: np.ndarray | None
    tanh: bool


@dataclass(frozen=True)
class SentenceModules:
    """What follows the Transformer: the pooling modes (concatenated in this order), the Dense layers in order, and
    whether the embedding is L2-normalised last."""

    pooling: tuple[str, ...]
    dense: tuple[Dense, ...]
    normalize: bool


def sentence_modules(folder: Path) -> SentenceModules | None:
    """The modules of the sentence-transformers folder `folder`, None for a folder without modules.json; one sentence
    for a module the toolkit cannot export (named), or a module's config or weights that do not read."""
    folder = Path(folder)
    listed = folder / "modules.json"
    if not listed.is_file():
        return None
    try:
        entries = json.loads(listed.read_text())
        kinds = [
            (str(e.get("type", "")), str(e.get("path", "")), str(e.get("name", e.get("idx", "?")))) for e in entries
        ]
    except (OSError, ValueError, AttributeError, TypeError) as e:
        raise CompressorError(f"{str(listed)!r} does not read as sentence-transformers' list of modules: {e}") from None
    order = [_class_of(kind) for kind, _, _ in kinds]
    expected = ["Transformer", "Pooling", *["Dense"] * order.count("Dense"), *(["Normalize"] * ("Normalize" in order))]
    for at, (kind, path, name) in enumerate(kinds):
        if at >= len(expected) or order[at] != expected[at] or (at == 0 and path not in ("", ".")):
            where = f" at {path!r}" if path else ""
            raise CompressorError(
                f"{str(folder)!r}'s modules.json names module {name} ({kind or 'no type'}){where}, which the toolkit "
                f"cannot export: it takes {TAKEN}"
            )
    if len(kinds) < 2:
        raise CompressorError(f"{str(folder)!r}'s modules.json names no Pooling module: it takes {TAKEN}")
    heads = [(kind, folder / path, name, _config(folder / path, name)) for kind, path, name in kinds[1:]]
    for kind, _, name, config in heads:
        for key in ("module_input_name", "module_output_name"):
            if config.get(key, SENTENCE) not in (SENTENCE, None):
                raise CompressorError(
                    f"{str(folder)!r}'s module {name} ({kind}) reads or writes {config[key]!r}; the toolkit exports "
                    f"modules of the sentence embedding ({SENTENCE!r}) alone"
                )
    _, _, pooling, config = heads[0]
    dense = tuple(_dense(path, name, config) for kind, path, name, config in heads if _class_of(kind) == "Dense")
    return SentenceModules(_pooling(config, pooling), dense, order[-1] == "Normalize")


def _class_of(kind: str) -> str:
    """The class a module's type names (sentence_transformers.models.Dense → Dense); '' for a type outside
    sentence-transformers (a module of the user's own code)."""
    return kind.rsplit(".", 1)[-1] if kind.startswith("sentence_transformers.") else ""


def _config(path: Path, name: str) -> dict:
    """A module's config.json ({} where it has none: a Normalize's folder is often empty or absent)."""
    file = path / "config.json"
    if not file.is_file():
        return {}
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise CompressorError(f"{str(file)!r}, module {name}'s config, does not read: {e}") from None
    return config if isinstance(config, dict) else {}


def _pooling(config: dict, name: str) -> tuple[str, ...]:
    """The Pooling's modes in the order sentence-transformers concatenates them: `pooling_mode` (a mode or a list,
    in its order), or the older pooling_mode_* flags (in POOLING_MODES' order; none set: mean)."""
    named = config.get("pooling_mode")
    if named is None:
        named = [mode for key, mode in LEGACY_MODES.items() if config.get(key)] or ["mean"]
    modes = [named] if isinstance(named, str) else list(named)
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown:
        raise CompressorError(
            f"the Pooling module {name} names modes {unknown}; sentence-transformers' are {POOLING_MODES}"
        )
    return tuple(modes)


def _dense(path: Path, name: str, config: dict) -> Dense:
    """A Dense module: its config's activation (sentence-transformers' default Tanh when none is named) and its
    weights from model.safetensors (linear.weight, linear.bias)."""
    activation = config.get("activation_function", "torch.nn.modules.activation.Tanh")
    if activation not in ACTIVATIONS or config.get("use_residual"):
        what = "a residual" if config.get("use_residual") else f"the activation {activation}"
        raise CompressorError(
            f"the Dense module {name} ({path.name}) has {what}, which the toolkit cannot export: it takes Dense layers "
            "with the identity or Tanh and no residual"
        )
    file = path / "model.safetensors"
    if not file.is_file():
        raise CompressorError(
            f"the Dense module {name} has no {str(file)!r}: the toolkit reads a module's weights from safetensors only"
        )
    tensors = _read_safetensors(file)
    weight, bias = tensors.get("linear.weight"), tensors.get("linear.bias")
    if weight is None or weight.ndim != 2 or (bias is not None and bias.shape != weight.shape[:1]):
        raise CompressorError(f"{str(file)!r} holds no linear.weight (out, in) and matching linear.bias")
    return Dense(weight, bias, ACTIVATIONS[activation])


_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def _read_safetensors(file: Path) -> dict[str, np.ndarray]:
    """A small safetensors file's tensors as float32 arrays (bfloat16: its 16 bits made float32's top half)."""
    try:
        data = file.read_bytes()
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + length])
        out = {}
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            if entry["dtype"] not in _DTYPES:
                raise ValueError(f"{key} is stored as {entry['dtype']}, not as F32, F16 or BF16")
            start, stop = (8 + length + offset for offset in entry["data_offsets"])
            array = np.frombuffer(data[start:stop], dtype=_DTYPES[entry["dtype"]]).reshape(entry["shape"])
            out[key] = (array.astype(np.uint32) << 16).view(np.float32) if entry["dtype"] == "BF16" else array
        return {key: array.astype(np.float32) for key, array in out.items()}
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        raise CompressorError(f"{str(file)!r} does not read as safetensors: {e}") from None
