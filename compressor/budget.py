"""Rank allocation under a parameter budget: greedy on the drop in error per parameter.

A layer at rank r has error e(r) = Σ_{j>r} σ_j² (σ from the SVD that its truncation uses), divided
by Σ_j σ_j² when the layers' spectra are not in common units (relative), and costs fixed +
r·per_rank parameters; past break-even (cost ≥ dense) it stays dense at error 0. The greedy order
does not depend on the budget, so more budget never gives more total error."""

import heapq
from dataclasses import dataclass

import torch
from torch import Tensor

from compressor.errors import RankError

__all__ = ["LayerCost", "Allocation", "allocate_ranks", "tail_error"]


@dataclass(frozen=True)
class LayerCost:
    name: str
    spectrum: Tensor  # singular values, descending
    per_rank: int  # parameters one more rank costs: K + D
    dense: int  # parameters of the layer left dense
    fixed: int = 0  # parameters paid at any rank (a dense head, …)

    def cost(self, rank: int | None) -> int:
        """Parameters at `rank`; None means dense."""
        return self.dense if rank is None else self.fixed + rank * self.per_rank

    def break_even(self) -> int:
        """Largest rank that still saves parameters (0 if none does)."""
        return max(0, min(len(self.spectrum), (self.dense - self.fixed - 1) // self.per_rank))


def tail_error(spectrum: Tensor, rank: int | None, relative: bool = True) -> float:
    """Σ_{j>r} σ_j², over Σ σ_j² when `relative`; 0 for dense (None)."""
    if rank is None:
        return 0.0
    energy = spectrum.to(torch.float64) ** 2
    return float(energy[rank:].sum() / (energy.sum().clamp_min(1e-300) if relative else 1.0))


@dataclass(frozen=True)
class Allocation:
    ranks: dict[str, int | None]  # None: left dense (past break-even)
    params: int
    predicted_error: dict[str, float]


def allocate_ranks(layers: list[LayerCost], budget: int, step: int = 8, relative: bool = True) -> Allocation:
    """Start every layer at rank `step`; repeatedly give `step` more rank (or, at break-even,
    the dense layer) to the layer whose error drops most per added parameter, while it fits.
    Errors are relative unless the spectra share units (`relative=False`: summed loss estimates)."""

    def error(layer: LayerCost, rank: int | None) -> float:
        return tail_error(layer.spectrum, rank, relative)

    ranks: dict[str, int | None] = {}
    for layer in layers:
        if layer.break_even() < 1:
            ranks[layer.name] = None
        else:
            ranks[layer.name] = min(step, layer.break_even())
    spent = sum(layer.cost(ranks[layer.name]) for layer in layers)
    if spent > budget:
        raise RankError(f"a budget of {budget:,} parameters is below the smallest allocation ({spent:,})")

    def proposal(layer: LayerCost):
        r = ranks[layer.name]
        if r is None:
            return None
        nxt = r + step if r + step <= layer.break_even() else None  # None: go dense
        gain = error(layer, r) - error(layer, nxt)
        extra = layer.cost(nxt) - layer.cost(r)
        return (-gain / max(extra, 1), layer.name, nxt, extra)

    heap = [p for p in map(proposal, layers) if p is not None]
    heapq.heapify(heap)
    by_name = {layer.name: layer for layer in layers}
    while heap:
        _, name, nxt, extra = heapq.heappop(heap)
        if spent + extra > budget:
            break
        ranks[name], spent = nxt, spent + extra
        p = proposal(by_name[name])
        if p is not None:
            heapq.heappush(heap, p)
    errors = {layer.name: error(layer, ranks[layer.name]) for layer in layers}
    return Allocation(ranks, spent, errors)
