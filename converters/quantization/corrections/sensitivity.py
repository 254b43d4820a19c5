"""Each linear layer's loss in 4 bits, which the 8-bit layers of int4-aware and the corrected schemes'
byte budget are chosen by. Measured (`int4.layer_losses`): the graph kind's distance of the whole
graph's output with that layer alone rounded, one graph saved and loaded per layer (about 1 s a layer
for MiniLM's 36, 35 s for SmolLM2's 211 at 540 MB). Estimated, above MEASURED_LAYERS layers: the
output error energy the rounding leaves in the layer itself, tr(Eᵀ G E) with E = W − Q and G = Σ xᵀx
its input Gram over the calibration tokens (the metric the corrections are fitted in), which weighs a
layer by what flows through it but not by what the layers after it make of its error."""

import numpy as np
import onnx
import torch

from converters.quantization.corrections.correction import input_grams, rounding_errors
from converters.quantization.rounding.int4 import (
    SENSITIVITY_BATCHES,
    alone,
    layer_losses,
    matmul_weights,
    quantize_matmuls,
)

__all__ = ["MEASURED_LAYERS", "gram_losses", "four_bit_losses"]

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
    """(output name, W − Q) of each MatMul of `model` rounded alone (int4.alone), one at a time: an LM's errors and
    weights in fp64 held at once were 4× its weights' bytes."""
    weighted = matmul_weights(model.graph)
    for node in model.graph.node:
        if node.name in weighted:
            rounded = quantize_matmuls(alone(model, node), block, accuracy_level, True, keep_grid=keep_grid, bits=bits)
            yield from rounding_errors(rounded, alone(model, node)).items()


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
    first SENSITIVITY_BATCHES of `feeds` up to MEASURED_LAYERS layers, else estimated from the input
    Grams (`grams`, or those of `feeds`) and `model` rounded (`quantized`, or rounded here); `keep_grid`:
    weights on a 4-bit grid rounded as the corrected schemes round them, `bits` 3: in 3 (int4.quantize_matmuls)."""
    layers = len(matmul_weights(model.graph))
    if layers <= MEASURED_LAYERS:
        return layer_losses(model, feeds[:SENSITIVITY_BATCHES], kind, block, accuracy_level, keep_grid, bits)
    grams = grams if grams is not None else input_grams(model, feeds, precise=False)  # a ranking: float32
    return gram_losses(model, grams, block, accuracy_level, quantized, keep_grid, bits)
