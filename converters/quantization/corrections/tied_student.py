"""A tied LM's student for the trained schemes (training.student_of). The graph's lookup reads its tied head's
codes (tied_codes), so the student's table is the head's rounding, E_q = (Q_s / s)ᵀ: Q_s the logits' MatMulNBits
weight read back, s SmoothQuant's scaling of its rows. A head split by frequency (tied_head) is two such products,
their columns the slots of its perm, put back in token order. A tied head's corrections are HeadCorrection modules
of its TiedLogits, trained with the others and added to its logits by a forward hook, logits[…, ids] += x (L / s) R,
the columns `ids` its half's tokens (all of them when the head is whole); they go back as L = s·A, R = B."""

from collections.abc import Callable

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from compressor.errors import UnmatchedWeightError
from compressor.tied_logits import TiedLogits
from converters.nbits_storage import dequantize_nbits
from converters.quantization.corrections.correction import corrected_layers
from converters.quantization.rounding.int4 import weight_names
from converters.quantization.storage.tied_codes import TRANSPOSED, smoothing_of
from files.onnx_files import Weights

__all__ = ["HeadCorrection", "hold_tied"]

_HALVES = ("_head_table", "_tail_table")  # table_head.split_table's names of a split table's halves


def _tied_outputs(smoothed: onnx.GraphProto) -> dict[str, str]:
    """Each MatMul output of `smoothed` whose weight is a table's transposed copy → that table's name."""
    inits = {i.name for i in smoothed.initializer}
    tables = {out: w.removesuffix(TRANSPOSED) for out, w in weight_names(smoothed).items() if w.endswith(TRANSPOSED)}
    return {out: table for out, table in tables.items() if table in inits}


class HeadCorrection(nn.Module):
    """A tied head's low-rank correction of its logits `ids` (one half's tokens, or all): (x A) B, A (D × r) and
    B (r × n) trainable."""

    def __init__(self, left: np.ndarray, right: np.ndarray, ids: np.ndarray):
        super().__init__()
        self.left = nn.Parameter(torch.from_numpy(left))
        self.right = nn.Parameter(torch.from_numpy(right))
        self.register_buffer("ids", torch.from_numpy(np.asarray(ids, dtype=np.int64)))
        self.in_order = bool(np.array_equal(ids, np.arange(len(ids))))

    def forward(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        correction = ((x @ self.left) @ self.right).to(logits.dtype)
        if self.in_order and len(self.ids) == logits.shape[-1]:
            return logits + correction  # the whole head
        return logits.index_add(-1, self.ids, correction)


def _add_corrections(module, args, output):
    for correction in module.corrections:
        output = correction(args[0], output)
    return output


def hold_tied(
    model: nn.Module,
    holder_of: Callable,
    fp32: onnx.ModelProto,
    smoothed: onnx.ModelProto,
    corrected: onnx.ModelProto,
) -> tuple[frozenset[str], frozenset[str], dict[str, tuple[str, np.ndarray]]]:
    """`model` (in place) with its tied table as `corrected`'s tied head rounds it (put by its Holder,
    `holder_of(fp32 value, what)`: training's) and the head's corrections HeadCorrection modules of its
    TiedLogits; (the logits outputs, the fp32 table) so held, both empty when the graph has no tied head, and each
    corrected output → (its HeadCorrection's name, s), for write_back."""
    tied = _tied_outputs(smoothed.graph)
    if not tied:
        return frozenset(), frozenset(), {}
    plain, scaled = Weights(fp32.graph), Weights(smoothed.graph)  # each weight read as it is taken
    graph = corrected.graph
    inits = {i.name: i for i in graph.initializer}
    rounded = {n.output[0].removesuffix("_rounded"): n for n in graph.node if n.op_type == "MatMulNBits"}
    corrected_outs = set(corrected_layers(corrected))
    tables = {w.removesuffix(TRANSPOSED) for w in weight_names(fp32.graph).values() if w.endswith(TRANSPOSED)}
    if len(tables) != 1:
        raise UnmatchedWeightError(
            f"int4-trained holds one tied table, this graph has {len(tables)}: use int4-corrected there"
        )
    (table,) = tables
    rows, corrections = {}, []
    perm = None
    for out, name in tied.items():
        prefix = next((name.removesuffix(h) for h in _HALVES if name.endswith(h)), None)
        if prefix is not None:
            perm = scaled[f"{prefix}_perm"].astype(np.int64)
        s = smoothing_of(smoothed.graph, name)  # W_s = diag(s) Eᵀ
        s = np.ones(scaled[name].shape[1]) if s is None else s
        rows[name] = (dequantize_nbits(graph, rounded[out]) / s[:, None]).T  # n × D
        if out in corrected_outs:
            left = (numpy_helper.to_array(inits[f"{out}_L"]) / s[:, None]).astype(np.float32)
            right = numpy_helper.to_array(inits[f"{out}_R"]).astype(np.float32)
            corrections.append((out, name, left, right, s))
    if perm is None:
        value = rows[table]
        ids = {table: np.arange(len(value))}
    else:  # the halves' rows in slot order (head first), back to token order
        head, tail = (next(n for n in rows if n.endswith(h)) for h in _HALVES)
        value = np.concatenate([rows[head], rows[tail]])[perm]
        order = np.argsort(perm)  # slot → token id
        ids = {head: order[: len(rows[head])], tail: order[len(rows[head]) :]}
    holder = holder_of(plain[table], f"the tied table {table!r}")
    holder.put(model, value)
    module = model.get_submodule(holder.name)
    heads = [m for m in model.modules() if isinstance(m, TiedLogits) and m.embedding is module]
    if not corrections:
        return frozenset(tied), frozenset({table}), {}
    if len(heads) != 1 or heads[0].score != "dot":
        raise UnmatchedWeightError(
            "int4-trained needs a tied head that scores by the dot product to hold its corrections: use "
            "int4-corrected there"
        )
    heads[0].corrections = nn.ModuleList(
        HeadCorrection(left, right, ids[name]) for _, name, left, right, _ in corrections
    )
    heads[0].register_forward_hook(_add_corrections)
    prefix = next(n for n, m in model.named_modules() if m is heads[0])
    links = {out: (f"{prefix}.corrections.{i}", s) for i, (out, *_, s) in enumerate(corrections)}
    return frozenset(tied), frozenset({table}), links
