"""Each linear layer's loss in 4 bits, which the 8-bit layers of int4-aware and the corrected schemes'
byte budget are chosen by. Measured (`int4.layer_losses`): the graph kind's distance of the whole
graph's output with that layer alone rounded, one graph saved and loaded per layer (about 1 s a layer
for MiniLM's 36, 35 s for SmolLM2's 211 at 540 MB). Estimated, above MEASURED_LAYERS layers: the
output error energy the rounding leaves in the layer itself, Σ ‖x E‖² = tr(Eᵀ G E) over the calibration
tokens x with E = W − Q and G = Σ xᵀx its input Gram (the metric the corrections are fitted in), which weighs a
layer by what flows through it but not by what the layers after it make of its error. Where no Gram is at hand,
the probe sums whichever is smaller for each input, its Gram or the errors of the layers it feeds
(`probed_losses`): an LM's K × K Grams were 1.3× its weights (Qwen2.5-0.5B's 4,864-wide down-projection inputs),
its errors as large as its weights (its head's 151,936 columns)."""

import collections
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper
from tqdm.auto import tqdm

from converters.quantization.corrections.errors import input_rows, rounding_errors
from converters.quantization.rounding.int4 import (
    SENSITIVITY_BATCHES,
    layer_losses,
    matmul_weights,
    quantize_matmuls,
)
from converters.quantization.rounding.one_node import SLICE_BYTES, alone
from files.onnx_files import weight_array

__all__ = ["MEASURED_LAYERS", "gram_losses", "probed_losses", "four_bit_losses"]

MEASURED_LAYERS = 64  # the most MatMuls whose losses are measured through the graph (MiniLM: 36)


def gram_losses(
    model: onnx.ModelProto,
    grams: Mapping,
    block: int,
    accuracy_level: int,
    quantized: onnx.ModelProto | None = None,
    keep_grid: bool = False,
    bits: int = 4,
) -> dict[str, float]:
    """MatMul node name → tr(Eᵀ G E) of its weight's int4-aware rounding error E in its input Gram G
    (`grams`, by output name: correction.input_grams, a tensor each); `model` has named nodes; `quantized`: `model`
    with every MatMul so rounded, when the caller has it already (`keep_grid`, `bits`: as int4.quantize_matmuls)."""
    names = {n.output[0]: n.name for n in model.graph.node}
    if quantized is not None:
        rounded = rounding_errors(quantized, model)
        errors = ((out, part) for out in rounded for part in rounded.columns(out))
    else:
        weighted = matmul_weights(model.graph)
        errors = _rounded_alone(
            model, [n for n in model.graph.node if n.name in weighted], block, accuracy_level, keep_grid, bits
        )
    losses: dict[str, float] = {}
    for out, error in errors:  # whole, or a slice of its columns at a time
        losses[names[out]] = losses.get(names[out], 0.0) + float(np.sum((grams[out].numpy() @ error) * error))
    return losses


def _rounded_alone(model: onnx.ModelProto, nodes: list, block: int, accuracy_level: int, keep_grid: bool, bits: int):
    """(output name, W − Q of a slice of SLICE_BYTES of its columns, float32) of each MatMul of `nodes` rounded alone
    (one_node.alone), a slice at a time, in order: a column's blocks are rounded alone, and an error's energy is
    the sum of its slices'. An LM's errors and weights in fp64 held at once were 4× its weights' bytes, its head's
    alone 2 GB at 0.5B."""
    inits = {i.name: i for i in model.graph.initializer}
    for node in tqdm(nodes, desc=f"each layer's {bits}-bit error", unit="layer", leave=False):
        weight = weight_array(inits[node.input[1]])
        step = max(1, SLICE_BYTES // (4 * weight.shape[0]))
        for at in range(0, weight.shape[1], step):
            part = numpy_helper.from_array(np.ascontiguousarray(weight[:, at : at + step]), node.input[1])
            one = alone(model, node, weight=part)
            rounded = quantize_matmuls(one, block, accuracy_level, True, keep_grid=keep_grid, bits=bits)
            ((out, error),) = rounding_errors(rounded, alone(model, node, weight=part)).items()
            yield out, error.astype(np.float32)


def probed_losses(
    model: onnx.ModelProto, feeds: list[dict], block: int, accuracy_level: int, keep_grid: bool = False, bits: int = 4
) -> dict[str, float]:
    """MatMul node name → Σ ‖x E‖² over the real tokens x of its input in the first batches of `feeds`
    (correction.input_rows), E its rounding error (rounded alone; `keep_grid`, `bits`: as int4.quantize_matmuls),
    from the smaller of what the probe can sum: an input's Gram G (K × K, shared by the MatMuls it feeds; then
    tr(Eᵀ G E)) or the errors E of the MatMuls it feeds (K × N each). Qwen2.5-0.5B: its down-projections' errors,
    the other inputs' Grams, 0.65 GB where its Grams alone were 2.5 GB and its errors 2 GB (its head's 0.5 GB)."""
    weighted = matmul_weights(model.graph)
    nodes = [node for node in model.graph.node if node.name in weighted]
    widths = collections.Counter()
    for node in nodes:
        widths[node.input[0]] += weighted[node.name][1]
    by_gram = {node.input[0] for node in nodes if weighted[node.name][0] <= widths[node.input[0]]}
    by_error = [n for n in nodes if n.input[0] not in by_gram]
    errors = {n.output[0]: np.empty(weighted[n.name], np.float32) for n in by_error}  # filled a slice at a time
    filled = dict.fromkeys(errors, 0)
    for out, part in _rounded_alone(model, by_error, block, accuracy_level, keep_grid, bits):
        errors[out][:, filled[out] : filled[out] + part.shape[1]] = part
        filled[out] += part.shape[1]
    inputs = {node.output[0]: node.input[0] for node in nodes}
    losses, grams = dict.fromkeys(errors, 0.0), {}
    for rows in input_rows(model, sorted(set(inputs.values())), feeds):
        for name in by_gram:
            gram = rows[name].T @ rows[name]
            if name in grams:
                grams[name] += gram  # in place: a chunk of an LM's batch is a row (eval.probe.row_chunks)
            else:
                grams[name] = gram
        for out, error in errors.items():
            losses[out] += float(np.sum(np.square(rows[inputs[out]] @ error), dtype=np.float64))
    del errors
    for out, error in _rounded_alone(
        model, [n for n in nodes if n.input[0] in by_gram], block, accuracy_level, keep_grid, bits
    ):
        losses[out] = losses.get(out, 0.0) + float(np.sum((grams[inputs[out]] @ error) * error, dtype=np.float64))
    return {node.name: losses[node.output[0]] for node in nodes}


def four_bit_losses(
    model: onnx.ModelProto,
    feeds: list[dict],
    kind,
    block: int,
    accuracy_level: int,
    grams: Mapping | None = None,
    quantized: onnx.ModelProto | None = None,
    keep_grid: bool = False,
    bits: int = 4,
) -> dict[str, float]:
    """MatMul node name → its loss in 4 bits (module docstring): measured through the graph on the
    first SENSITIVITY_BATCHES of `feeds` up to MEASURED_LAYERS layers, else estimated: in the input Grams `grams`
    when given, of `model` rounded (`quantized`, or rounded here), or else probed on `feeds` (probed_losses), each
    layer rounded alone (as `quantized` rounds it: each_node); `keep_grid`: weights on a 4-bit grid rounded as the
    corrected schemes round them, `bits` 3: in 3 (int4.quantize_matmuls)."""
    layers = len(matmul_weights(model.graph))
    if layers <= MEASURED_LAYERS:
        return layer_losses(model, feeds[:SENSITIVITY_BATCHES], kind, block, accuracy_level, keep_grid, bits)
    if grams is not None:
        return gram_losses(model, grams, block, accuracy_level, quantized, keep_grid, bits)
    return probed_losses(model, feeds, block, accuracy_level, keep_grid, bits)
