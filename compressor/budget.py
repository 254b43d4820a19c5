"""Sizes under a parameter budget: greedy on the drop in estimated loss per parameter.

A layer can be held in several ways (Point: a size such as a rank or a number of Kronecker terms,
its parameters and its estimated loss; the dense layer is the point of loss 0). Every layer starts
at its first point and the greedy repeatedly moves the layer whose next point lowers the loss most
per added parameter, until the best move no longer fits. Its moves do not depend on the budget, so
a larger budget never gives a larger summed loss. Two ways to order a layer's points:
- allocate_ranks walks one method's sizes in order (LayerCost: every rank up to break-even, then
  dense, so that the budget is spent to within one move; its error e(r) = Σ_{j>r} σ_j², σ from the
  SVD its truncation uses);
- allocate takes several methods' points together and walks their lower convex hull of
  (parameters, loss): the points no mix of the others beats, in falling loss drop per parameter,
  the greedy that suits a multiple-choice knapsack.
Losses are made relative to the layer's energy (the loss of nothing kept) unless they are in units
common to every layer (`relative=False`: summed loss estimates)."""

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from compressor.errors import RankError

__all__ = [
    "Point",
    "LayerCost",
    "MeasuredCost",
    "Allocation",
    "allocate_ranks",
    "allocate",
    "lower_hull",
    "tail_error",
]


@dataclass(frozen=True)
class Point:
    """One way to hold a layer: `size` (a rank, a number of terms; None: the dense layer), its
    parameters and its estimated loss; `tag` names the family of sizes (a method) among several."""

    size: int | None
    params: int
    loss: float
    tag: str = ""


def tail_error(spectrum: Tensor, rank: int | None, relative: bool = True) -> float:
    """Σ_{j>r} σ_j², over Σ σ_j² when `relative`; 0 for dense (None)."""
    if rank is None:
        return 0.0
    energy = spectrum.to(torch.float64) ** 2
    return float(energy[rank:].sum() / (energy.sum().clamp_min(1e-300) if relative else 1.0))


@dataclass(frozen=True)
class LayerCost:
    """A layer whose loss at rank r is the tail Σ_{j>r} σ_j² of a spectrum."""

    name: str
    spectrum: Tensor  # singular values, descending
    per_rank: int  # parameters one more rank costs: K + D
    dense: int  # parameters of the layer left dense
    fixed: int = 0  # parameters paid at any rank (a dense head, …)
    step: int = 1  # the sizes offered: every `step`-th rank, and the largest that saves parameters

    def cost(self, rank: int | None) -> int:
        """Parameters at `rank`; None means dense."""
        return self.dense if rank is None else self.fixed + rank * self.per_rank

    def break_even(self) -> int:
        """Largest rank that still saves parameters (0 if none does)."""
        return max(0, min(len(self.spectrum), (self.dense - self.fixed - 1) // self.per_rank))

    def nothing_kept(self, relative: bool = True) -> float:
        """The loss with nothing kept (1 when relative)."""
        return tail_error(self.spectrum, 0, relative)

    def points(self, relative: bool = True) -> list[Point]:
        """Rank `step` (or break-even, when smaller), then `step` more each time, and break-even (the
        largest rank that saves parameters), then the dense layer. The default step of 1 offers every
        rank, so that the budget is spent to within one rank; the tails are one cumulative sum."""
        top = self.break_even()
        ranks = sorted({*range(min(self.step, top), top + 1, self.step), top}) if top >= 1 else []
        energy = self.spectrum.to(torch.float64) ** 2
        tails = torch.cat([energy.flip(0).cumsum(0).flip(0), energy.new_zeros(1)])  # tails[r] = Σ_{j≥r} σ_j²
        if relative:
            tails = tails / energy.sum().clamp_min(1e-300)
        losses = tails.tolist()
        return [*(Point(r, self.cost(r), losses[r]) for r in ranks), Point(None, self.dense, 0.0)]


@dataclass(frozen=True)
class MeasuredCost:
    """A layer whose loss was measured at each size (no spectrum gives it): `sizes` ascending with
    their `params` and `losses`; `energy` is the loss with nothing kept (relative losses divide by it)."""

    name: str
    sizes: tuple[int, ...]
    params: tuple[int, ...]
    losses: tuple[float, ...]
    energy: float
    dense: int

    def nothing_kept(self, relative: bool = True) -> float:
        """The loss with nothing kept (1 when relative)."""
        return 1.0 if relative else self.energy

    def points(self, relative: bool = True) -> list[Point]:
        """The sizes that save parameters and lower the loss below every smaller size's, then the dense layer."""
        scale = max(self.energy, 1e-300) if relative else 1.0
        kept: list[Point] = []
        for size, params, loss in zip(self.sizes, self.params, self.losses):
            if params < self.dense and (not kept or loss / scale < kept[-1].loss):
                kept.append(Point(size, params, loss / scale))
        return [*kept, Point(None, self.dense, 0.0)]


@dataclass(frozen=True)
class Allocation:
    ranks: dict[str, int | None]  # the chosen size; None: left dense
    params: int
    predicted_error: dict[str, float]
    points: dict[str, Point] = field(default_factory=dict)  # the chosen point (its tag: which method)


def _greedy(chains: dict[str, Sequence[Point]], budget: int, unit: str = "parameters") -> Allocation:
    """Every layer at the first point of its chain; then repeatedly the move to a layer's next point
    that lowers the loss most per added parameter (or byte: `unit`), while it fits."""
    at = dict.fromkeys(chains, 0)
    spent = sum(chain[0].params for chain in chains.values())
    if spent > budget:
        raise RankError(f"a budget of {budget:,} {unit} is below the smallest allocation reachable ({spent:,} {unit})")

    def proposal(name: str):
        chain, i = chains[name], at[name]
        if i + 1 == len(chain):
            return None
        here, there = chain[i], chain[i + 1]
        extra = there.params - here.params
        return (-(here.loss - there.loss) / max(extra, 1), name, extra)

    heap = [p for p in map(proposal, chains) if p is not None]
    heapq.heapify(heap)
    while heap:
        _, name, extra = heapq.heappop(heap)
        if spent + extra > budget:
            break
        at[name], spent = at[name] + 1, spent + extra
        p = proposal(name)
        if p is not None:
            heapq.heappush(heap, p)
    chosen = {name: chain[at[name]] for name, chain in chains.items()}
    return Allocation({n: p.size for n, p in chosen.items()}, spent, {n: p.loss for n, p in chosen.items()}, chosen)


def allocate_ranks(layers: Sequence[LayerCost | MeasuredCost], budget: int, relative: bool = True) -> Allocation:
    """One method: each layer walks its own sizes in order (LayerCost: every rank up to break-even,
    then the dense layer), the move with the largest drop in error per added
    parameter first, while it fits. Errors are relative unless the spectra share units
    (`relative=False`: summed loss estimates)."""
    return _greedy({layer.name: layer.points(relative) for layer in layers}, budget)


def lower_hull(points: Sequence[Point]) -> list[Point]:
    """From the cheapest point (the lowest loss among equally cheap ones), the points of the lower
    convex hull of (parameters, loss) in order: each next one the steepest drop in loss per added
    parameter (the nearer one on a tie), so the drops per parameter never grow along it; up to the
    cheapest point of least loss. A monotone chain over the points sorted by parameters: O(n log n),
    for layers offered every rank at every width."""
    if not points:
        raise RankError("a layer needs at least one way to hold it")
    ordered = sorted(points, key=lambda p: (p.params, p.loss))
    cheapest = [p for i, p in enumerate(ordered) if i == 0 or p.params != ordered[i - 1].params]
    hull: list[Point] = []
    for p in cheapest:
        while len(hull) >= 2:
            o, a = hull[-2], hull[-1]
            if (a.params - o.params) * (p.loss - o.loss) - (a.loss - o.loss) * (p.params - o.params) >= 0:
                break  # o → a → p turns left or runs straight on: a stays (collinear points are kept)
            hull.pop()
        hull.append(p)
    falling = 1
    while falling < len(hull) and hull[falling].loss < hull[falling - 1].loss:
        falling += 1
    return hull[:falling]


def allocate(layers: dict[str, Sequence[Point]], budget: int, unit: str = "parameters") -> Allocation:
    """Several ways per layer (say the ranks of one method, the term counts of another and the dense
    layer, losses in one unit; or each of those at several widths, `params` then counting bytes):
    each layer walks the lower convex hull of its points, the move with the largest drop in loss per
    added parameter first, while it fits."""
    return _greedy({name: lower_hull(points) for name, points in layers.items()}, budget, unit)
