"""The corrections' ranks and widths (correction), from one byte budget over the layers (`correction_ranks`): a
layer's loss at rank r is its loss at its width, 4 bits or 3 (`sensitivity.four_bit_losses`: the whole graph's
output with that layer alone rounded, or for large graphs its own output error) times the share of its output
error energy the rank leaves, Σ_{j>r} σ_j² / Σ_j σ_j²; held in 8 bits instead (K·N/2 more bytes) it is that loss
times 2⁻⁸ (four more bits quarter the rounding error's energy four times). A layer in 3 bits
(three_bit_linear) is offered 4 bits too, K·N/8 more bytes for its loss times tr(E₄ᵀ G E₄) / tr(E₃ᵀ G E₃),
its two roundings' output errors measured (and 8 bits at K·N·5/8). The greedy of
`compressor.budget.allocate` walks each layer's lower hull of those points and buys the largest drop
in loss per byte first, so a layer whose error is spread over many directions goes to 8 bits and one
whose error a few directions hold gets a rank. Layers on a 4-bit grid get their offsets (grid.py) first if the budget
holds them all (losses measured a layer at a time undervalue a hundred small ones: BENCHMARKS.md, "The head's
rank"), else each as one more point; an LM's head gets ranks alone."""

from typing import NamedTuple

import onnx
import torch
from tqdm.auto import tqdm

from compressor.budget import Point, allocate, tail_error
from compressor.errors import CompressorError
from converters.quantization.corrections.correction import (
    correction_bytes,
    error_spectrum,
    output_energy,
    rounding_errors,
)
from converters.quantization.rounding.grid import offset_bytes, offset_residual
from converters.quantization.rounding.three_bit_linear import three_bit_layers

__all__ = ["RANK_STEP", "Plan", "correction_ranks", "plan_corrections"]

EIGHT_BITS = "8-bit"  # the tag of a layer's point held in 8 bits, uncorrected
FOUR_BITS = "4-bit"  # the tag of a 3-bit layer's point held in 4 bits, uncorrected
OFFSETS = "offsets"  # the tag of a layer's point on a 4-bit grid with its blocks' offsets (grid.add_offsets)
EIGHT_BIT_LOSS = 2.0**-8  # a layer's loss in 8 bits, relative to its loss in 4
RANK_STEP = 16  # ranks offered: multiples of 16, the smallest block ONNX Runtime's 8-bit kernels take


def _max_rank(k: int, n: int, form: str) -> int:
    """The largest rank offered: its factors cost less than the 4 more bits a weight would take (8 bits over 4)."""
    rank = 0
    while rank + RANK_STEP <= min(k, n) and correction_bytes(k, n, rank + RANK_STEP, form) < k * n // 2:
        rank += RANK_STEP
    return rank


class Plan(NamedTuple):
    """Each layer's rank (0: none), and the layers held in 8 bits, given their offsets, held in 4 bits instead."""

    ranks: dict[str, int]
    eight_bit: tuple[str, ...]
    offsets: tuple[str, ...]
    four_bit: tuple[str, ...] = ()


def correction_ranks(
    spectra: dict[str, torch.Tensor],
    losses: dict[str, float],
    shapes: dict[str, tuple[int, int]],
    budget: int,
    form: str = "int8",
    offsets: dict[str, tuple[int, float]] | None = None,
    ranks_only: frozenset[str] = frozenset(),
    wider: dict[str, float] | None = None,
) -> Plan:
    """The Plan under `budget` bytes (module docstring), the factors in `form`, `offsets` offered as layer →
    (their bytes, the share of the loss they leave) (grid.py; all bought first when the budget holds them), the
    layers `wider` (in 3 bits) offered 4 bits as layer → the share of the loss it leaves, the layers `ranks_only`
    offered neither 8 nor 4 bits; rank 0 where none pays."""
    offered = {name: Point(None, size, losses[name] * left, OFFSETS) for name, (size, left) in (offsets or {}).items()}
    held = sum(p.params for p in offered.values())
    wider = {name: left for name, left in (wider or {}).items() if name in spectra and name not in ranks_only}
    more = {
        name: shapes[name][0] * shapes[name][1] * (5 if name in wider else 4) // 8
        for name in spectra
        if name not in ranks_only
    }
    eight_bit = {
        name: Point(None, size, losses[name] * wider.get(name, 1.0) * EIGHT_BIT_LOSS, EIGHT_BITS)
        for name, size in more.items()
    }
    four_bit = {
        name: Point(None, shapes[name][0] * shapes[name][1] // 8, losses[name] * left, FOUR_BITS)
        for name, left in wider.items()
    }
    points = {
        name: [
            *(
                Point(r, correction_bytes(*shapes[name], r, form), losses[name] * tail_error(spectrum, r))
                for r in range(0, _max_rank(*shapes[name], form) + 1, RANK_STEP)
            ),
            *(extra[name] for extra in (eight_bit, four_bit, offered) if name in extra),
        ]
        for name, spectrum in spectra.items()
    }
    first = offered if held <= budget else {}  # every offset bought first, else each one point among the rest
    rest = {name: ps for name, ps in points.items() if name not in first}
    chosen = {**allocate(rest, budget - (held if first else 0), unit="bytes").points, **first}
    tagged = [tuple(name for name, p in chosen.items() if p.tag == tag) for tag in (EIGHT_BITS, OFFSETS, FOUR_BITS)]
    ranks = {name: p.size or 0 for name, p in chosen.items() if p.tag not in (EIGHT_BITS, OFFSETS, FOUR_BITS)}
    return Plan(ranks, *tagged)


def plan_corrections(
    quantized: onnx.ModelProto,
    fp32: onnx.ModelProto,
    grams: dict[str, torch.Tensor],
    losses: dict[str, float],
    budget: int,
    ranks_only: frozenset[str] = frozenset(),
    form: str = "int8",
    grid: frozenset[str] = frozenset(),
    block: int = 32,
    wider: onnx.ModelProto | None = None,
) -> Plan:
    """For `quantized` (the graph `fp32` with every MatMul in MatMulNBits, 4 bits or 3 in 4-bit layout): each
    layer's rank, the layers to hold in 8 bits instead, the layers of `grid` (on a 4-bit grid of `block`) to give
    their offsets instead and the 3-bit layers to hold in 4 bits as `wider` (the same graph, its MatMuls in 4 bits)
    rounds them, under `budget` bytes (correction_ranks, factors in `form`), all keyed by output name as `grams`
    and `losses` are; the layers `ranks_only` (output names) offered a rank but not 8 bits."""
    errors = rounding_errors(quantized, fp32)
    missing = sorted(set(errors) - set(grams))
    if missing:
        raise CompressorError(f"no calibration statistics for the layers {', '.join(missing[:3])}")
    three = {node.output[0] for node in three_bit_layers(quantized)} & set(errors) if wider is not None else set()
    four = rounding_errors(wider, fp32) if three else {}
    spectra, offsets, shares = {}, {}, {}
    for out in tqdm(errors, desc="each layer's error spectrum", unit="layer", leave=False):
        gram = grams[out]
        spectra[out] = error_spectrum(errors, out, gram)
        if out not in grid and out not in three:
            continue
        error = errors[out]  # whole: a layer's on a grid or in 3 bits, an LM's head never
        if out in grid:
            offsets[out] = (offset_bytes(*error.shape, block), offset_residual(error, gram.numpy(), block))
        if out in three and out in four:
            shares[out] = output_energy(four[out], gram.numpy()) / max(output_energy(error, gram.numpy()), 1e-30)
    shapes = {out: errors.shape(out) for out in errors}
    layer_losses = {out: losses.get(out, 0.0) for out in errors}
    return correction_ranks(spectra, layer_losses, shapes, budget, form, offsets, ranks_only, shares)
