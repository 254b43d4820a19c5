"""One budget over rank and bits (`--quantize mixed --budget SIZE`): every targeted layer gets a
size (a rank, a number of terms, or dense) and a width (fp32, int8 or int4), chosen together so
that the summed estimated loss is smallest within the bytes.

A layer held at size s and width w costs params(s) · bytes_per_weight(w) (an estimate: a 4-bit
weight's input dimension is padded to whole blocks, which a factor of rank below the block pays
for, and int8's per-channel scales are not counted) and is estimated to lose
loss(s) + q_w · (E − loss(s)): the method's loss at that size (docs/methods/: the K-FAC loss for fisher,
else relative to the layer's energy E, the loss of nothing kept) plus the relative squared error
q_w = ‖W − Q_w(W)‖² / ‖W‖² of rounding the layer's weight to w bits, taken on the part it keeps
(rounding noise scales with the weights it rounds). q_w is measured per layer with ONNX Runtime's
own block quantizer (`qdq_tensor`), in the blocks the exported graph will use: int4 in blocks of
`block` along the input dimension (MatMulNBits, GatherBlockQuantized along a row), int8 one scale
per output channel (dynamic int8's per-channel weights). The budget's greedy then walks each
layer's lower convex hull of (bytes, loss) over every size × width (compressor.budget.allocate).

The graph: the plan's sizes are compressed (and fine-tuned) as any plan; its widths quantize the
exported graph node by node (`quantize_mixed`): int4 layers through MatMulNBits (k-quant) and
GatherBlockQuantized (asymmetric), int8 layers through dynamic int8 (MatMulInteger), fp32 left."""

import copy
import math
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

from compressor.budget import Point
from compressor.dense import dense_weight
from compressor.errors import CompressorError
from converters.plan import WIDTHS
from converters.quantization.rounding.int4 import (
    INT4_ACCURACY,
    INT4_BLOCK,
    matmul_weights,
    name_nodes,
    quantize_matmuls,
    quantize_tables,
    quiet_quantizer,
    table_gathers,
)
from converters.quantization.storage.half_scales import SCALE_BYTES
from files.onnx_files import save_onnx

__all__ = ["WIDTHS", "bytes_per_weight", "quantization_error", "widened", "module_nodes", "quantize_mixed"]


def bytes_per_weight(width: str, block: int = INT4_BLOCK) -> float:
    """Bytes a weight costs at `width`: int4 is half a byte plus, per block, a scale (SCALE_BYTES) and a 4-bit
    zero point."""
    if width not in WIDTHS:
        raise CompressorError(f"a width is one of {', '.join(WIDTHS)}, got {width!r}")
    return {"fp32": 4.0, "int8": 1.0, "int4": 0.5 + (SCALE_BYTES + 0.5) / block}[width]


def quantization_error(module: nn.Module, width: str, block: int = INT4_BLOCK) -> float:
    """‖W − Q(W)‖² / ‖W‖² for `width`: int4 in blocks of `block` along each row (asymmetric), int8
    one symmetric scale per row, both by ONNX Runtime's qdq_tensor; 0 for fp32."""
    from onnxruntime.quantization.neural_compressor.weight_only import qdq_tensor

    if width == "fp32":
        return 0.0
    w = (
        (module.weight if isinstance(module, nn.Embedding) else dense_weight(module))
        .detach()
        .to(torch.float64)
        .cpu()
        .numpy()
    )
    group = block if width == "int4" else w.shape[1]
    padded = np.pad(w, ((0, 0), (0, -w.shape[1] % group)))
    bits, scheme = (4, "asym") if width == "int4" else (8, "sym")
    q = qdq_tensor(padded, bits, group, scheme)[:, : w.shape[1]]
    return float(((w - q) ** 2).sum() / max((w**2).sum(), 1e-300))


def widened(points: list[Point], nothing_kept: float, errors: dict[str, float], block: int = INT4_BLOCK) -> list[Point]:
    """Each of a layer's points at each width of `errors` (width → q_w): bytes params · bytes_per_weight,
    loss + q_w · (nothing_kept − loss), tagged METHOD|WIDTH (the dense point: |WIDTH); bytes rounded
    up, so that a budget spent to the byte still holds the layers."""
    return [
        Point(
            p.size,
            math.ceil(p.params * bytes_per_weight(w, block)),
            p.loss + q * (nothing_kept - p.loss),
            f"{p.tag}|{w}",
        )
        for p in points
        for w, q in errors.items()
    ]


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[./]", name) if t]


def module_nodes(graph: onnx.GraphProto, modules: Iterable[str]) -> dict[str, list[str]]:
    """Module name → the names of the nodes the 4-bit quantizer takes (MatMuls with a constant 2-D
    weight, axis-0 Gathers of tables) that the exporter put in its scope (the node name holds the
    module path: /wrapper/a/b.0/c/MatMul). A MatMul whose constant is its first input (a PHM
    layer's mixing of blocks, n × n·t) stays fp32."""
    quantizable = {*matmul_weights(graph), *table_gathers(graph)}
    weighted = [n.name for n in graph.node if n.name in quantizable]
    found = {}
    for module in modules:
        path = _tokens(module)
        found[module] = [
            name
            for name in weighted
            if any(_tokens(name)[k : k + len(path)] == path for k in range(len(_tokens(name)) - len(path) + 1))
        ]
        if not found[module]:
            raise CompressorError(f"no weight of the exported graph that a quantizer takes lies in module {module!r}")
    return found


def quantize_mixed(
    model: onnx.ModelProto, widths: dict[str, str], block: int = INT4_BLOCK, accuracy_level: int = INT4_ACCURACY
) -> onnx.ModelProto:
    """A copy of `model` with each module of `widths` (module name → width) quantized at its width;
    every other weight stays fp32."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = copy.deepcopy(model)
    name_nodes(model.graph)
    nodes = module_nodes(model.graph, widths)
    by_width = {w: {n for m, names in nodes.items() if widths[m] == w for n in names} for w in WIDTHS}
    matmuls = {n.name for n in model.graph.node if n.op_type == "MatMul"}
    four = by_width["int4"]
    if four & matmuls:
        model = quantize_matmuls(model, block, accuracy_level, aware=True, only=four & matmuls)
    if four - matmuls:
        model = quantize_tables(model, block, aware=True, only=four - matmuls)
    if by_width["int8"]:
        with tempfile.TemporaryDirectory() as work:
            plain, out = Path(work) / "plain.onnx", Path(work) / "int8.onnx"
            save_onnx(model, plain)
            with quiet_quantizer():
                quantize_dynamic(
                    plain,
                    out,
                    per_channel=True,
                    weight_type=QuantType.QInt8,
                    nodes_to_quantize=sorted(by_width["int8"]),
                    extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},  # types behind contrib 4-bit ops
                )
            model = onnx.load(str(out))
    return model
