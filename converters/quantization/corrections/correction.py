"""Low rank on the rounding error (LQER, QERA): round first, then spend a small rank on what the
rounding lost. A MatMul's weight W (K × N, y = x W) rounded to Q (MatMulNBits) leaves E = W − Q;
with the layer's input Gram G = Σ xᵀx over calibration tokens, the rank-r L R that minimises the
output error Σ ‖x (E − L R)‖² = tr((E − L R)ᵀ G (E − L R)) is the truncated SVD of Cᵀ E mapped
back, C Cᵀ = G + λI (QERA's closed form; `compressor.lowrank.whitened_factors`). The graph then
computes y = MatMulNBits(x) + (x L) R, L and R themselves in 8 bits, and each layer's error is
measured again after L and R are rounded. The factors' form (FACTOR_FORMS, the graph kind's
`factor_form`): "int8", ONNX Runtime's dynamic int8 MatMul (`quantize_dynamic`: int8 weights, one
scale a factor; x quantized to 8 bits per call), which ONNX Runtime's CPU kernels run fastest for a
short input and a long batch alike; or "nbits", 8-bit MatMulNBits in blocks at accuracy level 4, the
faster for an LM's one-token decode step, whose activations one scale a tensor would not hold
(BENCHMARKS.md, "The corrections' factors as dynamic int8"). The ranks and widths are planned by
correction_plan."""

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper
from tqdm.auto import tqdm

from compressor.errors import CompressorError
from compressor.lowrank import cholesky_whitener, whitened_factors
from converters.nbits_storage import dequantize_grid, dequantize_nbits, nbits_grid
from converters.quantization.corrections.errors import RoundingErrors, column_slices, input_rows, rounding_errors
from converters.quantization.rounding.int4 import quiet_quantizer, weight_names
from converters.quantization.storage.half_scales import SCALE_BYTES

__all__ = [
    "CORRECTION_SHARE",
    "check_correction_share",
    "Correction",
    "input_grams",
    "error_factors",
    "error_spectrum",
    "layer_factors",
    "FACTOR_FORMS",
    "correction_bytes",
    "output_energy",
    "relative_error",
    "add_corrections",
    "corrected_layers",
    "bias_before_correction",
    "store_factors",
]

# The bytes the corrections (and 8-bit layers) may add, a share of the graph's 4-bit codes: on MiniLM with
# half-precision scales, 0.2 keeps int4-trained within 0.17× the file (BENCHMARKS.md, "Scales in half
# precision").
CORRECTION_SHARE = 0.2
FACTOR_FORMS = ("int8", "nbits")
FACTOR_BITS = 8
FACTOR_BLOCK = {"left": 64, "right": 16}  # "nbits": L (K × r) blocks along K; R (r × N) along r, a multiple of 16
FACTOR_ACCURACY = 4  # "nbits": MatMulNBits' int8 compute ("The corrections' factors at accuracy level 4")
INT8_SCALE_BYTES = 5  # "int8": a factor's fp32 scale and int8 zero point


def check_correction_share(share: float) -> None:
    if not 0 < share < 1:
        raise CompressorError(f"--correction-share is a share of the 4-bit bytes in (0, 1), got {share!r}")


@dataclass(frozen=True)
class Correction:
    """One corrected layer: its rank, and its relative output error √(tr(Δᵀ G Δ) / tr(Wᵀ G W)) with
    Δ = W − Q alone, with the fp32 factors, and with the factors rounded as stored."""

    rank: int
    error_rounded: float
    error_corrected: float
    error_stored: float

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "rel_output_error": {
                "rounded": self.error_rounded,
                "corrected": self.error_corrected,
                "factors_rounded": self.error_stored,
            },
        }


class Grams(Mapping):
    """Output name → the input Gram Σ xᵀx of a MatMul, held in float32 (one array an input, shared by the MatMuls it
    feeds) and read as a float64 tensor of its own: an LM's K × K Grams in fp64 were 2.5× its weights at 0.5B
    (Qwen2.5-0.5B's 4,864-wide down-projection inputs), and a layer's is read alone."""

    def __init__(self, sums: dict[str, np.ndarray], inputs: dict[str, str]):
        self._sums, self._inputs = sums, inputs

    def __getitem__(self, out: str) -> torch.Tensor:
        return torch.from_numpy(self._sums[self._inputs[out]].astype(np.float64))

    def __contains__(self, out) -> bool:
        return out in self._inputs

    def __iter__(self):
        return iter(self._inputs)

    def __len__(self) -> int:
        return len(self._inputs)


def input_grams(model: onnx.ModelProto, feeds: list[dict]) -> Grams:
    """Output name → Σ xᵀx of the input of each MatMul with a constant weight, over the real tokens of the first
    GRAM_BATCHES of `feeds` (input_rows), summed in float32 a batch (or a batch's chunk) at a time."""
    weighted = weight_names(model.graph)
    matmuls = {n.output[0]: n.input[0] for n in model.graph.node if n.output[0] in weighted}
    sums: dict[str, np.ndarray] = {}
    for rows in input_rows(model, sorted(set(matmuls.values())), feeds):
        for name, x in rows.items():
            if name in sums:
                sums[name] += x.T @ x  # a chunk of an LM's batch is a few rows (eval.probe.row_chunks)
            else:
                sums[name] = (x.T @ x).astype(np.float32)
    return Grams(sums, {out: name for out, name in matmuls.items() if name in sums})


def error_factors(error: np.ndarray, gram: torch.Tensor, rank: int) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """(L, R, σ): L (K × r) and R (r × N) float32 with L R the rank-r fit of `error` (K × N) in the
    output metric of `gram` (K × K), and every singular value σ of the whitened error."""
    f = whitened_factors(torch.from_numpy(np.asarray(error, dtype=np.float64).T), gram, rank)  # Eᵀ ≈ up down
    return f.down.T.numpy().astype(np.float32), f.up.T.numpy().astype(np.float32), f.spectrum


def error_spectrum(errors: "RoundingErrors", out: str, gram: torch.Tensor) -> torch.Tensor:
    """Every singular value σ (descending) of the whitened rounding error of `out` that error_factors truncates (E in
    the metric S Sᵀ = G + λI): those of Sᵀ E where E (K × N) has no more columns than rows, else the roots of the
    eigenvalues of Sᵀ (Σ E_s E_sᵀ) S summed over E's column slices, K × K however many columns E has (an LM head's
    whole error and its SVD were 5 GB at 0.5B)."""
    k, n = errors.shape(out)
    if n <= k:
        return torch.linalg.svdvals(cholesky_whitener(gram)[0].T @ torch.from_numpy(errors[out]))
    _, energy = _whitened_energy(errors, out, gram)
    return torch.linalg.eigvalsh(energy).clamp_min(0).sqrt().flip(0)


def _whitened_energy(errors: "RoundingErrors", out: str, gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, Sᵀ (Σ E_s E_sᵀ) S): the whitener of `gram` (S Sᵀ = G + λI) and the rounding error's energy in it, K × K,
    summed over the error's column slices."""
    whitener, _ = cholesky_whitener(gram)
    energy = torch.from_numpy(sum(part @ part.T for part in errors.columns(out)))
    return whitener, whitener.T @ energy @ whitener


def layer_factors(errors: "RoundingErrors", out: str, gram: torch.Tensor, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """error_factors' (L, R) of the rounding error of `out`, E read whole where it has no more columns than rows,
    else a column slice at a time: Sᵀ (Σ E_s E_sᵀ) S = V Σ² Vᵀ (K × K), L = S⁻ᵀ V_r Σ_r^½, R = Σ_r^-½ V_rᵀ Sᵀ E (a
    slice of its columns at a time), the same product split as error_factors splits it."""
    k, n = errors.shape(out)
    if n <= k:
        return error_factors(errors[out], gram, rank)[:2]
    whitener, energy = _whitened_energy(errors, out, gram)
    values, vectors = torch.linalg.eigh(energy)  # ascending
    root = values.flip(0)[:rank].clamp_min(1e-300).sqrt().sqrt()  # Σ_r^½
    top = vectors.flip(1)[:, :rank]
    left = torch.linalg.solve_triangular(whitener.T, top * root, upper=True)
    project = (whitener @ top / root).T.numpy()
    right = np.concatenate([project @ part for part in errors.columns(out)], axis=1)
    return left.numpy().astype(np.float32), right.astype(np.float32)


def correction_bytes(k: int, n: int, rank: int, form: str = "int8") -> int:
    """Bytes of L (K × r) and R (r × N) in 8 bits, in `form`: one scale a factor, or one per block
    (SCALE_BYTES)."""
    if form == "int8":
        return rank * (k + n) + 2 * INT8_SCALE_BYTES * (rank > 0)
    left = rank * k + SCALE_BYTES * rank * -(-k // FACTOR_BLOCK["left"])
    right = rank * n + SCALE_BYTES * n * -(-rank // FACTOR_BLOCK["right"])
    return left + right


def output_energy(delta: np.ndarray, gram: np.ndarray) -> float:
    """tr(Δᵀ G Δ): the output error energy of Δ (K × N) on inputs of Gram G."""
    return float(np.sum((gram @ delta) * delta))


def relative_error(delta: np.ndarray, weight: np.ndarray, gram: np.ndarray) -> float:
    """√(tr(Δᵀ G Δ) / tr(Wᵀ G W)): the output error Δ leaves, relative to the output."""
    return float(np.sqrt(output_energy(delta, gram) / output_energy(weight, gram)))


def _quantize_factors(model: onnx.ModelProto, nodes: dict[str, list[str]], form: str) -> onnx.ModelProto:
    """The factor MatMuls `nodes` (side → node names) in 8 bits, in `form` (module docstring)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    if form == "int8":
        names = [name for side in nodes.values() for name in side]
        with tempfile.TemporaryDirectory() as tmp, quiet_quantizer():
            out = Path(tmp, "factors.onnx")
            float_default = {"DefaultTensorType": onnx.TensorProto.FLOAT}  # where shape inference stops at MatMulNBits
            quantize_dynamic(
                model,
                out,
                ["MatMul"],
                nodes_to_quantize=names,
                weight_type=QuantType.QInt8,
                use_external_data_format=True,  # a graph past protobuf's 2 GB too
                extra_options=float_default,
            )
            return onnx.load(str(out))
    for side, names in nodes.items():
        if not names:
            continue
        block = FACTOR_BLOCK[side]
        config = DefaultWeightOnlyQuantConfig(
            block_size=block, is_symmetric=True, bits=FACTOR_BITS, accuracy_level=FACTOR_ACCURACY
        )
        others = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in names]
        quantizer = MatMulNBitsQuantizer(model, block_size=block, nodes_to_exclude=others, algo_config=config)
        with quiet_quantizer():
            quantizer.process()
        model = quantizer.model.model
    return model


def add_corrections(
    quantized: onnx.ModelProto, fp32: onnx.ModelProto, grams: dict[str, torch.Tensor], ranks: dict[str, int]
) -> onnx.ModelProto:
    """`quantized` (the graph `fp32` with its MatMuls in MatMulNBits; changed in place: a copy of an LM's was the
    quantization's top, 3 GB at 0.5B) in which each layer of `ranks` (output name → rank > 0, as `grams` is keyed)
    computes MatMulNBits(x) + (x L) R, L and R fp32 initializers OUT_L and OUT_R."""
    model = quantized
    graph = model.graph
    errors = rounding_errors(model, fp32)
    rounded = {n.output[0]: n for n in graph.node if n.op_type == "MatMulNBits" and n.output[0] in errors}
    added: dict[str, list[onnx.NodeProto]] = {}
    for out, rank in tqdm([(out, r) for out, r in ranks.items() if r], desc="low-rank corrections", leave=False):
        left, right = layer_factors(errors, out, grams[out], rank)
        node = rounded[out]
        node.output[0] = f"{out}_rounded"
        graph.initializer.extend(
            [numpy_helper.from_array(left, f"{out}_L"), numpy_helper.from_array(right, f"{out}_R")]
        )
        added[node.name] = [
            helper.make_node("MatMul", [node.input[0], f"{out}_L"], [f"{out}_xL"], name=f"{out}_correction_left"),
            helper.make_node("MatMul", [f"{out}_xL", f"{out}_R"], [f"{out}_xLR"], name=f"{out}_correction_right"),
            helper.make_node("Add", [f"{out}_rounded", f"{out}_xLR"], [out], name=f"{out}_corrected"),
        ]
    nodes = [m for n in graph.node for m in [n, *added.get(n.name, [])]]  # each correction after its layer
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def corrected_layers(model: onnx.ModelProto) -> list[str]:
    """The output names (of their MatMuls in the fp32 graph) of the layers `add_corrections` corrected in `model`."""
    return [n.name.removesuffix("_corrected") for n in model.graph.node if n.name.endswith("_corrected")]


def bias_before_correction(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (in place) with each corrected layer's constant bias added to MatMulNBits' output before the
    correction is: (Q x + b) + (x L) R instead of (Q x + (x L) R) + b, the same sum, so that ONNX Runtime
    folds b into MatMulNBits (its bias input) and one Add is left a correction instead of two."""
    graph = model.graph
    constants = {i.name for i in graph.initializer}
    constants |= {n.output[0] for n in graph.node if n.op_type == "Identity" and n.input[0] in constants}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    order = list(graph.node)
    for out in corrected_layers(model):
        corrected = next(n for n in order if n.name == f"{out}_corrected")
        after = consumers.get(corrected.output[0], [])
        if len(after) != 1 or after[0].op_type != "Add" or not set(after[0].input) & constants:
            continue
        bias_add = after[0]
        k = list(bias_add.input).index(corrected.output[0])
        bias_add.input[k], result = f"{out}_rounded", bias_add.output[0]
        bias_add.output[0] = corrected.input[0] = f"{out}_biased"
        corrected.output[0] = result
        i, j = order.index(corrected), order.index(bias_add)
        order[i], order[j] = bias_add, corrected
    del graph.node[:]
    graph.node.extend(order)
    return model


def _stored_factor(graph: onnx.GraphProto, out: str, side: str, form: str) -> np.ndarray:
    """The factor (float64) that `graph` multiplies by in the correction of `out` (side "left": L, "right": R),
    as stored in `form`: quantize_dynamic's int8 codes (W_quantized, W_scale, W_zero_point), else the
    MatMulNBits node's."""
    if form == "nbits":
        product = f"{out}_xL" if side == "left" else f"{out}_xLR"
        node = next(n for n in graph.node if n.op_type == "MatMulNBits" and n.output[0] == product)
        return dequantize_nbits(graph, node)
    weight = f"{out}_{'L' if side == 'left' else 'R'}"
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer if i.name.startswith(weight)}
    codes = inits[f"{weight}_quantized"].astype(np.float64) - inits[f"{weight}_zero_point"].astype(np.float64)
    return codes * inits[f"{weight}_scale"].astype(np.float64)


def store_factors(
    model: onnx.ModelProto, fp32: onnx.ModelProto, grams: Mapping[str, torch.Tensor], form: str = "int8"
) -> tuple[onnx.ModelProto, dict[str, Correction]]:
    """`model` (from add_corrections, its factors fitted or trained) with L and R in 8 bits in `form`,
    and each corrected layer's output errors: rounded alone, with the fp32 factors, as stored (each summed over
    slices of its columns: column_slices)."""
    layers = corrected_layers(model)
    inits = {i.name: i for i in model.graph.initializer}
    factors = {out: [numpy_helper.to_array(inits[f"{out}_{side}"]) for side in "LR"] for out in layers}
    sides = {side: [f"{out}_correction_{side}" for out in layers] for side in FACTOR_BLOCK}
    model = _quantize_factors(model, sides, form)
    weights = {i.name: i for i in fp32.graph.initializer}
    names = weight_names(fp32.graph)
    rounded = {n.output[0]: n for n in model.graph.node if n.op_type == "MatMulNBits"}
    report = {}
    for out in tqdm(layers, desc="the corrections' errors as stored", leave=False):
        gram, weight = grams[out].numpy(), numpy_helper.to_array(weights[names[out]])
        grid = nbits_grid(model.graph, rounded[f"{out}_rounded"])
        left, right = factors[out]
        stored = [_stored_factor(model.graph, out, side, form) for side in ("left", "right")]
        energy = np.zeros(4)  # of W, of E = W − Q, of E − L R, of E − L R as stored
        for columns in column_slices(*weight.shape):
            w = weight[:, columns].astype(np.float64)
            error = w - dequantize_grid(grid, columns)
            fitted, kept = left.astype(np.float64) @ right[:, columns], stored[0] @ stored[1][:, columns]
            energy += [output_energy(delta, gram) for delta in (w, error, error - fitted, error - kept)]
        report[out] = Correction(right.shape[0], *(float(np.sqrt(e / energy[0])) for e in energy[1:]))
    return model, report
