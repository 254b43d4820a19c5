"""Train through the rounding (int4-trained): int4-corrected's graph, its corrections then learnt by
distillation against the fp32 model with every weight held as the graph rounds it.

The student is the PyTorch model with each rounded weight replaced by what ONNX Runtime multiplies by
or gathers: a MatMulNBits weight Q_s read back from its codes (nbits_storage.dequantize_nbits), a
GatherBlockQuantized table read back by running that node over every row, a 3-bit table read from its codes
(three_bit_table), a codebook table from its codes and codebooks (codebook_table; a table split by frequency: its
head's and tail's rows put back in token order). SmoothQuant scaled each weight row k by s_k (and divided the
activation by it), so the unsmoothed Q = Q_s / s row-wise, s read from the smoothed and unsmoothed weights; a
corrected layer becomes `CorrectedLinear(Q, L/s, R, b)`, and every other rounded nn.Linear or Conv1D one of rank 0,
each with one gain a block of Q's scales (Q ⊙ G: the codes stay, the scales learn).
Weights are found by value: the exported fp32 graph holds each weight as the module holds it (a
Linear's Wᵀ, a Conv1D's W, an Embedding's table, the fused decoder's q, k and v side by side: fused_student), or
a compressed module's own factor as it is or transposed (LowRankLinear's up and down, a low-rank table's codes
and basis, a dense head's rows); a tied table as its head rounds it (tied_student); a weight two holders hold is
refused. A compressed module's factor takes its rounded value frozen, and,
corrected, Q + L R (its correction keeps its closed form: no nn.Linear to train it in). After the
fine-tune (the corrections and gains of nn.Linear and Conv1D layers, their biases, the LayerNorms and RMS norms
(graph_norms) and a tied head's corrections trained, all else frozen; a codebook table's codebooks stay as k-means
left them, BENCHMARKS.md, "The word table's tail in codebooks") the factors go back as L = s·A, R = B, each block's
scale times its gain, the biases into their Add and the norms into their nodes (each in an initializer of its own),
and `correction.store_factors` rounds the factors to 8 bits. For the layers a graph multiplies in int8 (w4a8:
converters.quantization.corrections.int8_products) the input is rounded too, as DynamicQuantizeLinear rounds it
(`int8_rounded`)."""

import copy
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import helper, numpy_helper
from torch import nn

from compressor.corrected_linear import CorrectedLinear
from compressor.errors import UnmatchedWeightError
from converters.nbits_storage import constant_of, dequantize_nbits, scale_values
from converters.quantization.corrections.correction import corrected_layers
from converters.quantization.corrections.fused_student import fuse, put_side_by_side, side_by_side
from converters.quantization.corrections.graph_norms import GraphLayerNorm, GraphRMSNorm, norms_of, own_initializers
from converters.quantization.corrections.tied_student import HeadCorrection, hold_tied
from converters.quantization.rounding.grid import block_offsets, stored_offsets
from converters.quantization.rounding.int4 import weight_names
from converters.quantization.rounding.table_head import split_tables
from converters.quantization.rounding.three_bit_table import three_bit_outputs, three_bit_rows
from converters.quantization.storage.codebook_table import codebook_outputs, codebook_rows
from converters.submodules import set_submodule
from files.onnx_files import Weights

__all__ = [
    "CORRECTION_SECONDS",
    "Links",
    "TRAINED_MODULES",
    "student_of",
    "write_back",
    "dequantize_table",
    "trainer",
    "int8_rounded",
]

# The fine-tune of the trained schemes, in seconds (their learning rates: the schemes' correction_lr)
CORRECTION_SECONDS = 240.0


@dataclass
class Links:
    """What goes back into the graph: output name of each trained MatMul → (module name, s (K,), bias
    initializer or None) and → its MatMulNBits' scales initializer; module name of each norm → (scale
    initializer, bias initializer), an RMS norm's (scale initializer,); output name of each corrected tied head →
    (its HeadCorrection's name, s)."""

    layers: dict[str, tuple[str, np.ndarray, str | None]] = field(default_factory=dict)
    norms: dict[str, tuple[str, ...]] = field(default_factory=dict)
    scales: dict[str, str] = field(default_factory=dict)
    heads: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)


TRAINED_MODULES = (CorrectedLinear, GraphLayerNorm, GraphRMSNorm, HeadCorrection)  # what a student's fine-tune trains


@dataclass(frozen=True)
class Holder:
    """Who holds a weight of the graph: the module `name` (an nn.Linear, Conv1D or nn.Embedding; with `fused`, a
    module whose projections the graph multiplies side by side: fused_student), or, with `factor`, the parameter
    `name` of a compressed module, which the graph holds transposed if `transposed`."""

    name: str
    factor: bool = False
    transposed: bool = False
    fused: bool = False

    def put(self, model: nn.Module, value: np.ndarray) -> None:
        """Set the weight to `value` (as the graph holds it)."""
        tensor = torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32))
        if self.fused:
            put_side_by_side(model, self.name, value)
        elif not self.factor:
            module = model.get_submodule(self.name)
            module.weight.data = tensor.T.contiguous() if isinstance(module, nn.Linear) else tensor
        else:
            model.get_parameter(self.name).data = tensor.T.contiguous() if self.transposed else tensor


def _linear(module: nn.Module) -> bool:
    """Whether `module` multiplies by its weight (nn.Linear, Conv1D), not gathers from it (nn.Embedding)."""
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def int8_rounded(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x with its smoothed x / s rounded as ONNX Runtime's DynamicQuantizeLinear rounds it (uint8, one scale a
    tensor, (max(x, 0) − min(x, 0)) / 255, zero exact), times s again; the gradient passes straight through."""
    s = s.to(x.device)  # the hook's s stays on the CPU when the student goes to a GPU
    smoothed = x.float() / s  # in fp32 there too, where autocast hands x over in bf16
    low, high = smoothed.min().detach().clamp(max=0), smoothed.max().detach().clamp(min=0)
    scale = ((high - low) / 255).clamp(min=1e-12)
    zero = torch.round(-low / scale)
    codes = (torch.round(smoothed / scale) + zero).clamp(0, 255)
    return x + ((codes - zero) * scale * s - x).detach()


def _round_input(s: torch.Tensor, module: nn.Module, args: tuple) -> tuple:
    return (int8_rounded(args[0], s), *args[1:])


def _key(value: torch.Tensor | np.ndarray) -> bytes:
    """A digest of a weight's float32 values and its shape (the bytes themselves as keys were a second copy of
    every weight: 2 GB at 0.5B)."""
    array = value.detach().numpy() if isinstance(value, torch.Tensor) else value
    array = np.ascontiguousarray(array, dtype=np.float32)
    return hashlib.blake2b(array.data, digest_size=16).digest() + repr(array.shape).encode()


def _held_weights(model: nn.Module) -> dict[bytes, Holder]:
    """The digest (`_key`) of each weight as the exported graph holds it → its one holder (Holder)."""
    held: dict[bytes, list[Holder]] = {}
    in_modules = set()
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            value = module.weight.T
        elif isinstance(module, nn.Embedding) or type(module).__name__ == "Conv1D":
            value = module.weight
        else:
            continue
        in_modules.add(id(module.weight))
        held.setdefault(_key(value), []).append(Holder(name))
    for name, value in side_by_side(model).items():
        held.setdefault(_key(value), []).append(Holder(name, fused=True))
    for name, param in model.named_parameters():
        if param.dim() == 2 and id(param) not in in_modules:
            for transposed in (False, True):
                holder = Holder(name, factor=True, transposed=transposed)
                held.setdefault(_key(param.T if transposed else param), []).append(holder)
    return {key: holders[0] for key, holders in held.items() if len(holders) == 1}


def _holder_of(held: dict[bytes, Holder], weight: np.ndarray, what: str) -> Holder:
    holder = held.get(_key(weight))
    if holder is None:
        raise UnmatchedWeightError(
            f"int4-trained needs each rounded weight held by one module or parameter; {what} is not: use "
            "int4-corrected there"
        )
    return holder


def dequantize_table(model: onnx.ModelProto, node: onnx.NodeProto, rows: int) -> np.ndarray:
    """The table (rows × D, float32) a GatherBlockQuantized node gathers from, by running it on every row."""
    consts = {name: constant_of(model.graph, name) for name in node.input if name}
    consts = {
        name: init if init.name == name else numpy_helper.from_array(scale_values(model.graph, name), name)
        for name, init in consts.items()
        if init is not None
    }  # scales in half precision: read back
    ids = helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [rows])
    out = helper.make_tensor_value_info("rows", onnx.TensorProto.FLOAT, None)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    gather = helper.make_node(
        node.op_type, [node.input[0], "ids", *node.input[2:]], ["rows"], domain=node.domain, **attrs
    )
    graph = helper.make_graph([gather], "table", [ids], [out], list(consts.values()))
    single = helper.make_model(graph, opset_imports=list(model.opset_import))
    single.ir_version = model.ir_version
    session = ort.InferenceSession(single.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"ids": np.arange(rows, dtype=np.int64)})[0]


def _own_bias(graph: onnx.GraphProto, out: str) -> tuple[str | None, np.ndarray | None]:
    """(OUT_bias, its value): the constant added to the MatMul output `out`, in an initializer of its own;
    (None, None) when no Add of a constant follows `out`."""
    for node in graph.node:
        if node.op_type == "Add" and out in node.input and len(node.input) == 2:
            k = 1 - list(node.input).index(out)
            values = own_initializers(graph, node, {k: f"{out}_bias"})
            if values:
                return f"{out}_bias", values[0]
    return None, None


def student_of(
    model: nn.Module,
    fp32: onnx.ModelProto,
    smoothed: onnx.ModelProto,
    corrected: onnx.ModelProto,
    int8_inputs: frozenset[str] = frozenset(),
    offsets: frozenset[str] = frozenset(),
) -> tuple[nn.Module, Links]:
    """`model` (changed in place) holding every weight as `corrected` (add_corrections' graph of the
    smoothed `smoothed` of the exported `fp32`) holds it, its corrected layers CorrectedLinear, the input of
    each layer of `int8_inputs` (output names) rounded to 8 bits (int8_rounded), each layer of `offsets` (on a
    4-bit grid, its error the graph's offsets take after training: grid.py) held frozen as Q + B O; each
    corrected layer's bias gets an initializer of its own in `corrected` (in place)."""
    held = _held_weights(model)
    plain, scaled = Weights(fp32.graph), Weights(smoothed.graph)  # each weight read as it is taken
    unsmoothed, smoothed_w = weight_names(fp32.graph), weight_names(smoothed.graph)
    graph = corrected.graph
    inits = {i.name: i for i in graph.initializer}
    rounded = {n.output[0].removesuffix("_rounded"): n for n in graph.node if n.op_type == "MatMulNBits"}
    corrected_outs = set(corrected_layers(corrected))
    tied_outs, tied_tables, heads = hold_tied(model, partial(_holder_of, held), fp32, smoothed, corrected)
    links = Links(norms=norms_of(model, graph), heads=heads)
    rounded_inputs: dict[str, torch.Tensor] = {}  # module name → its smoothing s
    for out, node in rounded.items():
        if out not in unsmoothed or out in tied_outs:
            continue  # a correction's own factor, or a tied head (its table's: hold_tied)
        weight = plain[unsmoothed[out]]
        w, w_s = weight.astype(np.float64), scaled[smoothed_w[out]].astype(np.float64)
        holder = _holder_of(held, weight, f"the weight of {out!r}")
        del weight
        s = (w_s * w).sum(1) / np.maximum((w * w).sum(1), 1e-30)  # (K,): W_s = diag(s) W
        s[(w * w).sum(1) == 0] = 1.0
        q = dequantize_nbits(graph, node) / s[:, None]  # (K, N) as x q
        if out in offsets:  # the offsets add_offsets computes from this rounding, which stays (no gains)
            block = next(helper.get_attribute_value(a) for a in node.attribute if a.name == "block_size")
            codes, scale = stored_offsets(block_offsets(w_s - q * s[:, None], block))
            holder.put(model, q + np.repeat(codes * np.float64(scale), block, axis=0) / s[:, None])
            continue
        if out in int8_inputs and not holder.factor:
            rounded_inputs[holder.name] = torch.from_numpy(s.astype(np.float32))
        gains = holder.fused or not holder.factor and _linear(model.get_submodule(holder.name))  # not a table
        if out not in corrected_outs and not gains:
            holder.put(model, q)
            continue
        if holder.factor:  # a compressed module's factor: its correction's closed form, frozen
            holder.put(
                model,
                q + (numpy_helper.to_array(inits[f"{out}_L"]) / s[:, None]) @ numpy_helper.to_array(inits[f"{out}_R"]),
            )
            continue
        q = torch.from_numpy(q.astype(np.float32))
        if out in corrected_outs:
            left = torch.from_numpy((numpy_helper.to_array(inits[f"{out}_L"]) / s[:, None]).astype(np.float32))
            right = torch.from_numpy(numpy_helper.to_array(inits[f"{out}_R"]).astype(np.float32))
        else:  # no correction: its scales and bias alone
            left, right = torch.zeros(q.shape[0], 0), torch.zeros(0, q.shape[1])
        block = next(helper.get_attribute_value(a) for a in node.attribute if a.name == "block_size")
        name = holder.name
        bias, value = _own_bias(graph, out)
        values = None if value is None else torch.from_numpy(value)
        layer = CorrectedLinear(q.T, left, right, values, block=block)
        if holder.fused:
            name = fuse(model, name, layer)
        else:
            set_submodule(model, name, layer)
        links.layers[out] = (name, s, bias)
        links.scales[out] = node.input[2]
    for name, s in rounded_inputs.items():
        model.get_submodule(name).register_forward_pre_hook(partial(_round_input, s))
    gathers = {n.output[0]: n.input[0] for n in fp32.graph.node if n.op_type == "Gather"}  # output → table
    tables = {n.output[0]: (n,) for n in graph.node if n.op_type == "GatherBlockQuantized"}
    narrow = three_bit_outputs(graph) | codebook_outputs(graph)
    tables.update({n.output[0]: (n,) for n in graph.node if n.output[0] in narrow})
    for out, (head, tail, perm) in split_tables(graph).items():  # the word table by frequency, 8-bit head
        for node in (head, tail):
            tables.pop(node.output[0], None)
        tables[out] = (head, tail, perm)
    for out, nodes in tables.items():
        if gathers.get(out) in tied_tables:
            continue  # its rows are its tied head's: hold_tied
        table = plain.get(gathers.get(out, ""), np.zeros((0, 0), np.float32))
        _holder_of(held, table, f"the table of {out!r}").put(model, _rounded_table(corrected, nodes))
    return model, links


def _rounded_table(model: onnx.ModelProto, nodes: tuple) -> np.ndarray:
    """The table one lookup (a GatherBlockQuantized node, or a 3-bit or codebook lookup's last node) gathers from,
    or a split table's (head, tail, perm): its head and tail rows in the token order of perm."""
    rows = {i.name: i.dims for i in model.graph.initializer}

    def table(node: onnx.NodeProto) -> np.ndarray:
        for read in (three_bit_rows, codebook_rows):
            narrow = read(model.graph, node.output[0])
            if narrow is not None:
                return narrow
        return dequantize_table(model, node, rows[node.input[0]][0])

    parts = [table(node) for node in nodes[:2]]
    return parts[0] if len(nodes) == 1 else np.concatenate(parts)[nodes[2]]


def write_back(corrected: onnx.ModelProto, student: nn.Module, links: Links) -> onnx.ModelProto:
    """`corrected` (in place) with the trained factors L = s·A, R = B (a tied head's too), biases, norms (LayerNorms'
    scales and biases, RMS norms' scales) and block scales (times their gains) of `student`."""
    values = {}
    inits = {i.name: i for i in corrected.graph.initializer}
    for out, (name, s, bias) in links.layers.items():
        module = student.get_submodule(name)
        if module.rank:
            values[f"{out}_L"] = module.left.detach().double().numpy() * s[:, None]
            values[f"{out}_R"] = module.right.detach().numpy()
        if bias is not None:
            values[bias] = module.bias.detach().numpy()
        scales = numpy_helper.to_array(inits[links.scales[out]])
        values[links.scales[out]] = (scales.reshape(module.gain.shape) * module.gain.detach().numpy()).reshape(
            scales.shape
        )
    for out, (name, s) in links.heads.items():
        module = student.get_submodule(name)
        values[f"{out}_L"] = module.left.detach().double().numpy() * s[:, None]
        values[f"{out}_R"] = module.right.detach().numpy()
    for name, inits_of in links.norms.items():
        module = student.get_submodule(name)
        values.update(zip(inits_of, (p.detach().numpy() for p in (module.weight, getattr(module, "bias", None)))))
    for key, value in values.items():
        inits[key].CopyFrom(numpy_helper.from_array(np.asarray(value, dtype=np.float32), key))
    return corrected


def trainer(model: nn.Module, fit: Callable[[nn.Module], None]):
    """The `train` argument of quantize_onnx for the fp32 graph of `model`: a copy of `model` made a
    student of the corrected graph (the layers `int8_inputs` with their inputs rounded to 8 bits, those of
    `offsets` offset: student_of),
    `fit` (a fine-tune of its CorrectedLinear modules) run on it, and its factors written back."""

    def train(
        fp32: onnx.ModelProto,
        smoothed: onnx.ModelProto,
        corrected: onnx.ModelProto,
        int8_inputs: frozenset[str] = frozenset(),
        offsets: frozenset[str] = frozenset(),
    ) -> onnx.ModelProto:
        student, links = student_of(copy.deepcopy(model), fp32, smoothed, corrected, int8_inputs, offsets)
        fit(student)
        return write_back(corrected, student, links)

    return train
