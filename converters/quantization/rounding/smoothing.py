"""SmoothQuant (Xiao et al., 2023) on an ONNX graph, the data-aware half of `int8-aware`.

Dynamic int8 quantizes each MatMul's activation x with one scale per tensor, set at run time by
its largest entry; in a BERT encoder a few channels of a few tokens ([CLS]) are 5–10× the rest,
so most entries get a handful of levels. For each activation x that feeds MatMuls with constant
weights W (K × N), channel j is divided by s_j and row j of every such W multiplied by s_j —
x Wᵀ… unchanged in fp32 — with s_j = max|x_j|^α / max_n |W_jn|^(1−α), the maxima over the
calibration tokens and over every W that x feeds; the division is one Mul node per activation.
Per-channel weight scales then absorb the outliers the activation scale no longer has to."""

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tqdm.auto import tqdm

from eval.graph import numbers_session
from eval.memory import trim_heap
from eval.probe import full_feed, row_chunks
from files.onnx_files import copy_fields, load_lazy, load_onnx, save_external, save_onnx, weight_array

__all__ = [
    "SMOOTH_ALPHA",
    "OUTLIER_RATIO",
    "smoothable",
    "probe_activations",
    "activation_absmax",
    "outliers",
    "smooth",
    "smoothed",
]

# An input whose largest channel is this many times its median channel holds outliers that one int8 scale a
# tensor does not survive: a 110M MPNet's FFN down-projections read 47–62× and fail int8's gate; MiniLM's worst is 19×
OUTLIER_RATIO = 32

# Measured on all-MiniLM-L6-v2 (pydoc calib split → eval split recall@10 after int8): α 0.5 0.872,
# 0.65 0.936, 0.75 0.940, 0.8 0.943, 0.85 0.941, 0.9 0.940; plain dynamic int8 0.906.
SMOOTH_ALPHA = 0.8
SCALE_CLAMP = (1e-4, 1e4)


def smoothable(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """activation name → the indices of the MatMul nodes it feeds whose weight is a 2-D fp32
    initializer used by that node alone."""
    weights = {i.name: i for i in graph.initializer if len(i.dims) == 2 and i.data_type == TensorProto.FLOAT}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    groups: dict[str, list[int]] = {}
    for k, node in enumerate(graph.node):
        activation, weight = (node.input[:2]) if node.op_type == "MatMul" else ("", "")
        if weight in weights and uses[weight] == 1 and activation not in weights:
            groups.setdefault(activation, []).append(k)
    return groups


def probe_activations(model: onnx.ModelProto, names: list[str], feeds: list[dict[str, np.ndarray]]):
    """(the batch, {name: value} of the graph's intermediate tensors `names` on it) for each batch of `feeds`, cut in
    rows where the tensors would be large together (eval.probe.row_chunks: the tensors the MatMuls read are as wide
    as their weights' rows; the graph's own outputs, an LM's logits, neither asked nor computed: the nodes `names`
    do not depend on are left out of the probe, since ONNX Runtime runs every node of a graph it does not optimise —
    Gemma-3-270M's 262,144 logits a token held 4.3 GB for two batches of 32 × 128 tokens). The graph is let go once
    written for the probe's session: a caller that holds no other reference frees it before the session reads its
    weights. The session keeps no memory arena: an arena kept the largest chunk's tensors (SmolLM2's int4-aware
    sensitivity probe peaked at 1.24 GiB with one, 1.20 without, in the same time)."""
    weights = {i.name: i.dims[0] for i in model.graph.initializer if len(i.dims) == 2}
    widths = {
        n.input[0]: weights[n.input[1]] for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights
    }
    kept = [onnx.ValueInfoProto.FromString(o.SerializeToString()) for o in model.graph.output]
    nodes = [onnx.NodeProto.FromString(n.SerializeToString()) for n in model.graph.node]  # given back after
    _keep_only_what_feeds(model.graph, names)
    del model.graph.output[:]
    model.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names)
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "probe.onnx"
        try:  # the probes saved with `model` itself, not a copy of it: an LM's weights are most of the memory
            save_onnx(model, path)
        finally:
            del model.graph.output[:]
            model.graph.output.extend(kept)
            del model.graph.node[:]
            model.graph.node.extend(nodes)
        del model
        session = numbers_session(path, arena=False)
    width = sum(widths.get(n, 0) for n in names) if all(n in widths for n in names) else None
    parts = [part for whole in feeds for part in row_chunks(session, whole, width=width)]
    for feed in tqdm(parts, desc=f"activations of {len(names)} tensors", unit="batch", leave=False):
        yield feed, dict(zip(names, session.run(names, full_feed(session, feed))))


def _keep_only_what_feeds(graph: onnx.GraphProto, names: list[str]) -> None:
    """In place: `graph`'s nodes but those the tensors `names` depend on, in order (none left out where a node holds a
    subgraph, whose outer names it reads unsaid)."""
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for a in n.attribute):
        return
    needed, kept = set(names), []
    for node in reversed(graph.node):
        if needed.intersection(node.output):
            needed.update(node.input)
            kept.append(onnx.NodeProto.FromString(node.SerializeToString()))
    del graph.node[:]
    graph.node.extend(reversed(kept))


def activation_absmax(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """max |x_j| per channel (last axis) of every smoothable activation over the batches `feeds` (`model` let go
    while they run: probe_activations)."""
    outputs = {o.name for o in model.graph.output}
    names = [n for n in smoothable(model.graph) if n not in outputs]
    probes = probe_activations(model, names, feeds)
    del model
    absmax: dict[str, np.ndarray] = {}
    for _, values in probes:
        for name, x in values.items():
            peak = np.abs(x).reshape(-1, x.shape[-1]).max(axis=0)
            absmax[name] = np.maximum(absmax[name], peak) if name in absmax else peak
    return absmax


def outliers(model: onnx.ModelProto, absmax: dict[str, np.ndarray]) -> dict[str, float]:
    """Output name → max_j |x_j| / median_j |x_j| of each MatMul (smoothable) whose input x reaches OUTLIER_RATIO."""
    ratios = {name: float(peak.max() / max(np.median(peak), 1e-30)) for name, peak in absmax.items()}
    nodes = list(model.graph.node)
    return {
        nodes[k].output[0]: round(ratios[name], 1)
        for name, indices in smoothable(model.graph).items()
        if ratios.get(name, 0.0) >= OUTLIER_RATIO
        for k in indices
    }


def _scales(absmax: np.ndarray, weights: list[np.ndarray], alpha: float) -> np.ndarray:
    """s_j = max|x_j|^α / max|W_j·|^(1−α); 1 where either side is zero."""
    w = np.max([np.abs(m).max(axis=1) for m in weights], axis=0).astype(np.float64)
    x = absmax.astype(np.float64)
    s = np.where((x > 0) & (w > 0), x**alpha / np.maximum(w, 1e-30) ** (1 - alpha), 1.0)
    return np.clip(s, *SCALE_CLAMP)


def _smoothing(
    model: onnx.ModelProto, absmax: dict[str, np.ndarray], alpha: float
) -> tuple[onnx.ModelProto, Iterator[TensorProto | tuple[str, np.ndarray]]]:
    """(`model` smoothed, without its initializers; those initializers one at a time: each of `model`'s, its rows
    multiplied by s where it is a smoothed MatMul's weight (a (name, array) pair: files.onnx_save.save_external),
    then each activation's 1 / s)."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    rows: dict[str, np.ndarray] = {}  # weight name → the s its rows are multiplied by
    inputs: dict[int, str] = {}  # node index → its smoothed activation
    inverses, before = [], {}  # the 1 / s initializers; node index → the Mul that goes before it
    for k, (name, consumers) in enumerate(smoothable(graph).items()):
        if name not in absmax:
            continue
        weights = [graph.node[i].input[1] for i in consumers]
        s = _scales(absmax[name], [weight_array(inits[w]) for w in weights], alpha)
        rows.update(dict.fromkeys(weights, s))
        inputs.update(dict.fromkeys(consumers, f"{name}/smoothed"))
        inverses.append(numpy_helper.from_array((1 / s).astype(np.float32), f"smooth_inverse_{k}"))
        mul = helper.make_node("Mul", [name, inverses[-1].name], [f"{name}/smoothed"], name=f"smooth_{k}")
        before[min(consumers)] = mul
    out = onnx.ModelProto()
    copy_fields(model, out, ("graph",))
    copy_fields(graph, out.graph, ("node", "initializer"))
    for k, node in enumerate(graph.node):
        if k in before:
            out.graph.node.append(before[k])
        out.graph.node.append(node)
        if k in inputs:
            out.graph.node[-1].input[0] = inputs[k]

    def initializers() -> Iterator[TensorProto | tuple[str, np.ndarray]]:
        for init in graph.initializer:
            if init.name in rows:  # scaled in place, handed on as an array: no copy of a 262,144-row head
                scaled = weight_array(init)  # a lazy weight's read into an array of its own
                if not scaled.flags.writeable or scaled.dtype != np.float32:
                    scaled = scaled.astype(np.float32)
                scaled *= rows[init.name][:, None]
                yield init.name, scaled
            else:
                yield init
        yield from inverses

    return out, initializers()


def smooth(model: onnx.ModelProto, absmax: dict[str, np.ndarray], alpha: float = SMOOTH_ALPHA) -> onnx.ModelProto:
    """A new graph: `model` with every activation in `absmax` divided channel-wise by s (one Mul, placed before its
    first consumer) and its MatMuls' weight rows multiplied by s; built a weight at a time, not copied and then
    changed (a weight replaced in a protobuf message leaves its old bytes in the message: files.onnx_files)."""
    out, initializers = _smoothing(model, absmax, alpha)
    out.graph.initializer.extend(
        numpy_helper.from_array(i[1], i[0]) if isinstance(i, tuple) else i for i in initializers
    )
    return out


def smoothed(
    fp32: Callable[[], onnx.ModelProto],
    feeds: list[dict[str, np.ndarray]],
    alpha: float,
    channels: Callable[[onnx.ModelProto, dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
    work: Path | None = None,
) -> tuple[onnx.ModelProto, dict[str, float]]:
    """(the graph `fp32()` reads smoothed at `alpha` on the calibration batches `feeds`, a new graph; the layers whose
    inputs hold outliers: `outliers`); `channels(model, absmax)`: the activations to smooth, of their maxima (None:
    all). `fp32` (Source.fp32, its weights left in their file or not) is read twice, the first graph let go while
    the probe's session holds its weights (Qwen2.5-0.5B's graph and session at once were 7.5 GB); the smoothed
    graph is written a weight at a time, not built beside the one it comes from (two graphs in memory, the
    smoothing's peak at 0.5B), and read back whole, or with `work` (a folder that outlives the graph) left there,
    each weight read as it is taken (files.onnx_files.load_lazy)."""
    absmax = activation_absmax(fp32(), feeds)
    model = fp32()
    outlying = outliers(model, absmax)
    skeleton, initializers = _smoothing(model, absmax if channels is None else channels(model, absmax), alpha)
    del model  # held by `initializers` until they are written
    if work is not None:
        path = Path(tempfile.mkdtemp(dir=work)) / "smoothed.onnx"
        save_external(skeleton, path, initializers)
        return load_lazy(path), outlying
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "smoothed.onnx"
        save_external(skeleton, path, initializers)
        del initializers
        trim_heap()  # the graph it came from given back before the smoothed one is read
        return load_onnx(path), outlying
