"""Each linear layer's loss in 4 bits, which the 8-bit layers of int4-aware and the corrected schemes'
byte budget are chosen by. Measured (`int4.layer_losses`): the graph kind's distance of the whole
graph's output with that layer alone rounded, one graph saved and loaded per layer (about 1 s a layer
for MiniLM's 36, 35 s for SmolLM2's 211 at 540 MB). Estimated, above MEASURED_LAYERS layers: the
output error energy the rounding leaves in the layer itself, Σ ‖x E‖² = tr(Eᵀ G E) over the calibration
tokens x with E = W − Q and G = Σ xᵀx its input Gram (the metric the corrections are fitted in), which weighs a
layer by what flows through it but not by what the layers after it make of its error. Summed from E itself
where no Gram is at hand: E is its weight's size, where an LM's K × K Grams were 1.7× its weights (Qwen2.5-0.5B's
4,864-wide down-projection inputs) and x E costs N / K of xᵀx there"""

import numpy as np
import onnx
import torch
from tqdm.auto import tqdm

from converters.quantization.corrections.correction import input_rows, rounding_errors
from converters.quantization.rounding.int4 import (
    SENSITIVITY_BATCHES,
    alone,
    layer_losses,
    matmul_weights,
    quantize_matmuls,
)

__all__ = ["MEASURED_LAYERS", "gram_losses", "error_losses", "four_bit_losses"]

MEASURED_LAYERS = 64  # the most MatMuls whose losses are measured through the graph (MiniLM: 36)


def gram_losses(
    model: onnx.ModelProto,
    grams: dict[str, torch.Tensor],
    block: int,
    accuracy_level: int,
    quantized: onnx.ModelProto | None = None,
    keep_grid: bool = False,
    bits: int = 4,
) -> dict[str, float]:
    """MatMul node name → tr(Eᵀ G E) of its weight's int4-aware rounding error E in its input Gram G
    (`grams`, by output name: correction.input_grams); `model` has named nodes; `quantized`: `model`
    with every MatMul so rounded, when the caller has it already (`keep_grid`, `bits`: as int4.quantize_matmuls)."""
    names = {n.output[0]: n.name for n in model.graph.node}
    if quantized is not None:
        errors = rounding_errors(quantized, model).items()
    else:
        errors = _rounded_alone(model, block, accuracy_level, keep_grid, bits)
    return {names[out]: float(np.sum((grams[out].numpy() @ error) * error)) for out, error in errors}


def _rounded_alone(model: onnx.ModelProto, block: int, accuracy_level: int, keep_grid: bool, bits: int):
    """(output name, W − Q, float32) of each MatMul of `model` rounded alone (int4.alone), one at a time: an LM's
    errors and weights in fp64 held at once were 4× its weights' bytes."""
    weighted = matmul_weights(model.graph)
    nodes = [node for node in model.graph.node if node.name in weighted]
    for node in tqdm(nodes, desc=f"each layer's {bits}-bit error", unit="layer", leave=False):
        rounded = quantize_matmuls(alone(model, node), block, accuracy_level, True, keep_grid=keep_grid, bits=bits)
        ((out, error),) = rounding_errors(rounded, alone(model, node)).items()
        yield out, error.astype(np.float32)


def error_losses(model: onnx.ModelProto, feeds: list[dict], errors) -> dict[str, float]:
    """MatMul node name → Σ ‖x E‖² (float64 over float32 products) over the real tokens x of its input in the
    first batches of `feeds` (correction.input_rows), of each (output name, E = W − Q) of `errors`."""
    errors = {out: np.asarray(error, dtype=np.float32) for out, error in errors}
    nodes = {n.output[0]: n for n in model.graph.node if n.output[0] in errors}
    losses = dict.fromkeys(errors, 0.0)
    for rows in input_rows(model, sorted({n.input[0] for n in nodes.values()}), feeds):
        for out, error in errors.items():
            losses[out] += float(np.sum(np.square(rows[nodes[out].input[0]] @ error), dtype=np.float64))
    return {nodes[out].name: loss for out, loss in losses.items()}


def four_bit_losses(
    model: onnx.ModelProto,
    feeds: list[dict],
    kind,
    block: int,
    accuracy_level: int,
    grams: dict[str, torch.Tensor] | None = None,
    quantized: onnx.ModelProto | None = None,
    keep_grid: bool = False,
    bits: int = 4,
) -> dict[str, float]:
    """MatMul node name → its loss in 4 bits (module docstring): measured through the graph on the
    first SENSITIVITY_BATCHES of `feeds` up to MEASURED_LAYERS layers, else estimated in the input
    Grams `grams` when given, or from the errors on `feeds`, of `model` rounded (`quantized`, or rounded here);
    `keep_grid`: weights on a 4-bit grid rounded as the corrected schemes round them, `bits` 3: in 3
    (int4.quantize_matmuls)."""
    layers = len(matmul_weights(model.graph))
    if layers <= MEASURED_LAYERS:
        return layer_losses(model, feeds[:SENSITIVITY_BATCHES], kind, block, accuracy_level, keep_grid, bits)
    if grams is not None:
        return gram_losses(model, grams, block, accuracy_level, quantized, keep_grid, bits)
    if quantized is not None:
        return error_losses(model, feeds, rounding_errors(quantized, model).items())
    return error_losses(model, feeds, _rounded_alone(model, block, accuracy_level, keep_grid, bits))
