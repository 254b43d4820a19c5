"""The CPU an int8 graph is written for (--target-cpu): the widest weights its integer path multiplies exactly.

ONNX Runtime multiplies uint8 activations a by int8 weights w. With VNNI (and AMX, and ARM's dot products) each
product is summed straight into int32. Without it (AVX2, AVX-512 without VNNI) `vpmaddubsw` first sums two
neighbouring products in int16, which saturates: a₁w₁ + a₂w₂ ≤ 255 (|w₁| + |w₂|) must stay ≤ 32,767, so the
weights keep to 7 bits, |w| ≤ 64 (255 · 128 = 32,640) — ONNX Runtime's own `reduce_range`, and the reason Optimum
and sentence-transformers write one int8 file per instruction set. Each target's int8 graph holds int8 weights
of at most TARGETS[target] in magnitude: int8 and int8-aware through `quantize_dynamic(reduce_range=…)`, w4a8's
int8 products through their folded codes' level (int8_products). Several targets (`avx2,avx512_vnni`): one graph
each, under sentence-transformers' names (files.model_folder.graph_file), the one this machine runs measured."""

import numpy as np

from compressor.errors import CompressorError
from eval.environment import integer_path

__all__ = [
    "TARGETS",
    "INT16_MAX",
    "NATIVE",
    "resolve_target",
    "targets_of",
    "measured_target",
    "int8_level",
    "reduces_range",
    "widest_pair",
]

TARGETS = {"avx2": 64, "avx512": 64, "avx512_vnni": 127, "arm64": 127}  # target → largest |int8 weight|
# Each machine's integer path (eval.environment) → the target whose files it runs exactly and fastest
PATH_TARGET = {"amx": "avx512_vnni", "avx_vnni": "avx512_vnni", "arm64_dot": "arm64", "sse": "avx2"}
NATIVE = "native"  # the default: the machine the graph is written on
INT16_MAX = 32767
UINT8_MAX = 255


def resolve_target(name: str | None) -> str:
    """A target of TARGETS for `name` (None or NATIVE: this machine's integer path's); an unknown name is refused,
    the targets listed."""
    if name is None or name == NATIVE:
        path = integer_path()
        return PATH_TARGET.get(path, path)
    if name not in TARGETS:
        raise CompressorError(
            f"--target-cpu is one of {NATIVE}, {', '.join(TARGETS)} (AMX and AVX-VNNI CPUs run avx512_vnni's "
            f"files), got {name!r}"
        )
    return name


def targets_of(name: str | None) -> tuple[str, ...]:
    """The targets `name` asks, each resolved and checked (resolve_target), once each: one, or several joined by
    commas (`avx2,avx512_vnni`)."""
    parts = (name or NATIVE).split(",")
    return tuple(dict.fromkeys(resolve_target(part.strip()) for part in parts))


def measured_target(name: str | None) -> str:
    """Of the targets `name` asks, the one a graph is measured for on this machine: its own if asked, else the
    first (a graph for another path runs here too, only its figures are not the ones it will have there)."""
    targets, own = targets_of(name), resolve_target(NATIVE)
    return own if own in targets else targets[0]


def int8_level(target: str) -> int:
    """The largest |int8 weight| a graph for `target` holds."""
    return TARGETS[resolve_target(target)]


def reduces_range(target: str) -> bool:
    """Whether `target`'s int8 weights keep to 7 bits (its pairs of products are summed in int16)."""
    return int8_level(target) < 127


def widest_pair(weight: np.ndarray) -> int:
    """The largest 255 (|w₁| + |w₂|) of an int8 weight: the most two neighbouring products of uint8 activations
    can sum to, whichever two of its weights `vpmaddubsw` pairs (≤ INT16_MAX: no saturation on any path)."""
    top = np.sort(np.abs(np.asarray(weight, dtype=np.int64)).ravel())[-2:]
    return int(UINT8_MAX * top.sum())
