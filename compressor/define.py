"""The pieces of a DeFINE unit (Mehta et al., ICLR 2020, §3 and appendix A.1), pure functions on tensors.

A hierarchical group transform (HGT) of N layers maps e (n wide) to k: layer l has output width
o_l = n + ⌊(k − n)·l/N⌋ (o_0 = n, o_N = k) and g_l = max(⌊g_max / 2^{l−1}⌋, 1) groups. A group linear
layer cuts its input into g chunks and multiplies chunk j by its own W_j (a/g × b/g), one batched
matmul: y = [x_1 W_1, …, x_g W_g]. Before each layer after the first, the mixer cuts e and the
previous output each into g_l chunks and interleaves them, [e_1, y_1, e_2, y_2, …], so that group j
of layer l sees chunk j of the input beside chunk j of what came before."""

from dataclasses import dataclass

import torch
from torch import Tensor

from compressor.errors import ShapeError
from compressor.ranks import check_rank

__all__ = ["HGTSchedule", "hgt_schedule", "group_linear", "mix", "CHUNK"]

CHUNK = 4096  # map rows a unit runs on at once when it runs on the whole table


@dataclass(frozen=True)
class HGTSchedule:
    """Widths o_0 = n, …, o_N = k and groups g_1 … g_N of an HGT; layer l maps its input (o_0 for
    l = 1, o_0 + o_{l−1} after the mixer) to o_l in g_l groups."""

    widths: tuple[int, ...]
    groups: tuple[int, ...]

    @property
    def layers(self) -> int:
        return len(self.groups)

    def inputs(self, layer: int) -> int:
        """The input width of layer `layer` (0-based): e alone for the first, e beside the previous output after."""
        return self.widths[0] + (self.widths[layer] if layer > 0 else 0)

    def params(self) -> int:
        """Weights and biases of the group linear layers: Σ_l (in_l · o_l / g_l + o_l)."""
        return sum(self.inputs(i) * o // g + o for i, (o, g) in enumerate(zip(self.widths[1:], self.groups)))


def _widths(n: int, k: int, layers: int) -> tuple[int, ...]:
    return tuple(n + (k - n) * layer // layers for layer in range(layers + 1))


def _groups(layers: int, max_groups: int) -> tuple[int, ...]:
    return tuple(max(max_groups >> layer, 1) for layer in range(layers))  # ⌊g_max / 2^{l−1}⌋, l = layer + 1


def _undivided(n: int, k: int, layers: int, max_groups: int) -> list[str]:
    """For each layer whose groups do not divide a width it cuts (its input e, the previous output
    it mixes in, its own output): 'layer l cuts w, … into g'."""
    widths, groups = _widths(n, k, layers), _groups(layers, max_groups)
    bad = []
    for layer, g in enumerate(groups, start=1):
        cut = [n, *([widths[layer - 1]] if layer > 1 else []), widths[layer]]
        uneven = list(dict.fromkeys(w for w in cut if w % g))
        if uneven:
            bad.append(f"layer {layer} cuts {' and '.join(map(str, uneven))} into {g}")
    return bad


def _nearest(valid, start: int, low: int, high: int) -> list[int]:
    """The nearest values below and above `start` within [low, high] for which valid(value) holds."""
    below = next((v for v in range(start - 1, low - 1, -1) if valid(v)), None)
    above = next((v for v in range(start + 1, high + 1) if valid(v)), None)
    return [v for v in (below, above) if v is not None]


def hgt_schedule(n: int, k: int, layers: int, max_groups: int) -> HGTSchedule:
    """The widths and groups of an HGT from n to k in `layers` layers of at most `max_groups` groups,
    checked: k ≥ 2n (the fit starts from the rank-n table carried through ± copies, see define_fit),
    and every width divisible by the groups of each layer that cuts it (else the nearest k, or n, that would be)."""
    n, k = check_rank(n, "the DeFINE map width n"), check_rank(k, "the DeFINE width k")
    layers = check_rank(layers, "the number of DeFINE layers N")
    max_groups = check_rank(max_groups, "the DeFINE groups g_max")
    if k < 2 * n:
        raise ShapeError(f"the widest DeFINE layer k must be at least 2n = {2 * n} (the expansion), got k = {k}")
    bad = _undivided(n, k, layers, max_groups)
    if bad:
        fits = [("k", v) for v in _nearest(lambda v: not _undivided(n, v, layers, max_groups), k, 2 * n, 4 * k)]
        fits = fits or [("n", v) for v in _nearest(lambda v: not _undivided(v, k, layers, max_groups), n, 1, k // 2)]
        hint = f"; {' or '.join(f'{name} = {v}' for name, v in fits)} would" if fits else ""
        raise ShapeError(
            f"DeFINE widths {' → '.join(map(str, _widths(n, k, layers)))} must divide by the groups of the layers "
            f"that cut them ({', '.join(map(str, _groups(layers, max_groups)))}): {'; '.join(bad)}{hint}"
        )
    return HGTSchedule(_widths(n, k, layers), _groups(layers, max_groups))


def group_linear(x: Tensor, weight: Tensor) -> Tensor:
    """x (N, g·a) → (N, g·b): chunk j of x times weight[j] (a × b), for all g chunks in one batched
    matmul; never the (g·a) × (g·b) block-diagonal matrix."""
    groups, a, b = weight.shape
    if groups == 1:
        return x @ weight[0]  # (N, a) @ (a, b)
    chunks = x.reshape(x.shape[0], groups, a).transpose(0, 1)  # (g, N, a)
    return torch.matmul(chunks, weight).transpose(0, 1).reshape(x.shape[0], groups * b)  # (g, N, b) → (N, g·b)


def mix(e: Tensor, y: Tensor, groups: int) -> Tensor:
    """e (N, n) and y (N, o) each cut into `groups` chunks and interleaved: (N, n + o) =
    [e_1, y_1, e_2, y_2, …, e_g, y_g]."""
    rows, n, o = e.shape[0], e.shape[1], y.shape[1]  # widths spelled out: an ONNX Reshape of 0 rows takes no −1
    chunks = [e.reshape(rows, groups, n // groups), y.reshape(rows, groups, o // groups)]
    return torch.cat(chunks, dim=-1).reshape(rows, n + o)
