"""ONNX export of a model as its kind's graph (an encoder: input_ids, attention_mask →
last_hidden_state), opset ≥ 17 with dynamic batch and sequence axes, checked against PyTorch in
ONNX Runtime on ids and shapes the tracer never saw before the file takes its final name. Before
the trace, a model may be put in another form its methods offer (in_export_form: a DeFINE unit
cached as a table, …), as the registry's ExportForms say; export names no method."""

import copy
import functools
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from compressor.errors import CompressorError, ExportParityError
from converters.calibration import Calibration
from converters.kinds import kind_of
from converters.plan import Plan, match_plan
from converters.registry import ExportForms, export_forms, method_of
from converters.submodules import set_submodule
from eval.benchmark import PARITY_KEY
from eval.memory import trim_heap
from eval.probe import PARITY_SHAPES, PAST, positions, sample_ids
from files.atomic import atomic_file, tensor_bytes
from files.onnx_files import WeightFile, add_props, load_onnx, save_onnx

__all__ = [
    "LookupGraph",
    "ExportResult",
    "export_onnx",
    "export_embedding_onnx",
    "export_form_rows",
    "check_export_forms",
    "in_export_form",
    "check_parity",
    "parity_cases",
    "parity_of",
    "sample_inputs",
    "PARITY_ATOL",
]

PARITY_ATOL = 1e-4


class LookupGraph(nn.Module):
    """An embedding alone: input_ids → (B, T, D) (named last_hidden_state), for measuring a lookup."""

    inputs = ("input_ids",)
    output = "last_hidden_state"

    def __init__(self, embedding: nn.Module):
        super().__init__()
        self.embedding = embedding

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.embedding(input_ids)


@dataclass(frozen=True)
class ExportResult:
    path: Path
    parity_max_abs: float


def sample_inputs(vocab: int, batch: int, seq: int, seed: int) -> tuple[Tensor, Tensor]:
    """eval.probe.sample_ids as tensors: random ids with the first and last real tokens present, and a padded row."""
    ids, mask = sample_ids(vocab, batch, seq, seed)
    return torch.from_numpy(ids), torch.from_numpy(mask)


def parity_cases(graph: nn.Module, vocab: int, names: list[str]) -> list[tuple[dict, list[np.ndarray]]]:
    """(feed of the graph's inputs `names`, PyTorch's outputs on it: the first, then a cached graph's presents) on ids
    of shapes unlike the traced one. A graph with a key-value cache reads each batch with its pasts empty, then one
    more token fed the presents PyTorch made: ONNX Runtime is fed the same, and its presents are checked against
    PyTorch's. Made before the session: the model can go before it reads the graph (an LM's weights twice
    otherwise: PyTorch's and ONNX Runtime's)."""
    ours = graph.input_names() if hasattr(graph, "input_names") else names
    cases = []
    for batch, seq, seed in PARITY_SHAPES:
        ids, mask = sample_ids(vocab, batch, seq, seed)
        feed = {"input_ids": ids, "attention_mask": mask}
        if "position_ids" in ours:
            feed["position_ids"] = positions(mask, seq)
        pasts = [n for n in ours if n.startswith(PAST)]
        feed.update({n: np.zeros((batch, graph.heads, 0, graph.head_dim), np.float32) for n in pasts})
        outputs = _pytorch(graph, feed, ours)
        cases.append((feed, outputs[: 1 + len(pasts)]))
        if pasts:
            mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], axis=1)
            step = {"input_ids": ids[:, :1], "attention_mask": mask, "position_ids": positions(mask, 1)}
            step.update(zip(pasts, outputs[1:]))
            cases.append((step, _pytorch(graph, step, ours)[: 1 + len(pasts)]))
    return cases


def _pytorch(graph: nn.Module, feed: dict[str, np.ndarray], ours: list[str]) -> list[np.ndarray]:
    """The outputs of the PyTorch `graph` fed its inputs `ours` from `feed`."""
    with torch.no_grad():
        out = graph(*(torch.from_numpy(feed[n]) for n in ours))
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


def parity_of(
    cases: list[tuple[dict, list[np.ndarray]]], onnx_path: Path, output: str, atol: float, relative: bool = False
) -> float:
    """Max |ONNX Runtime − PyTorch| of `output` and of a cached graph's presents (its outputs after `output`, in
    order; of the rows without padding) over the `cases` (parity_cases), the padding left out; raise above atol
    (`relative`: atol times the output's largest |value|, at least atol: fp32's summation order errs in proportion to
    the values, and a 24-layer Gemma 3 encoder's hidden states reach hundreds; a wrong graph is off by their own
    size)."""
    import onnxruntime as ort

    trim_heap()  # what the export freed given back before the session reads the graph
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_prepacking", "1")  # no packed copy of the weights: one run
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    presents = [o.name for o in session.get_outputs() if o.name != output]
    worst = 0.0
    for feed, expected in cases:
        fetched = [output, *presents[: len(expected) - 1]]
        stepping = any(n.startswith(PAST) and feed[n].shape[2] for n in names)
        for name, got, want in zip(fetched, session.run(fetched, {n: feed[n] for n in names}), expected):
            if got.shape != want.shape:
                raise ExportParityError(
                    f"ONNX {name} shape {got.shape} differs from PyTorch's {want.shape} at input shape "
                    f"{feed['input_ids'].shape}"
                )
            error = np.abs(got - want)
            mask = feed.get("attention_mask")
            if mask is not None and name == output and not stepping:  # what padding gives is nobody's output
                error = error[mask[:, -got.shape[1] :].astype(bool)]
            elif mask is not None:  # a present, or a step's logits: rows without padding (GroupQueryAttention keeps a
                # padded row's tokens together, where PyTorch keeps them in their places: a window of positions
                # then holds other tokens)
                error = error[mask.all(axis=1)]
            tolerance = atol * max(1.0, float(np.abs(want).max()) if relative and want.size else 0.0)
            if error.size and not error.max() <= tolerance:
                raise ExportParityError(
                    f"ONNX Runtime and PyTorch differ by {float(error.max()):.3g} on {name}, above the tolerance "
                    f"{tolerance:.3g}" + (f" ({atol:g} of its largest magnitude, at least that)" if relative else "")
                )
            worst = max(worst, float(error.max()) if error.size else 0.0)
    return worst


def check_parity(graph: nn.Module, onnx_path: Path, vocab: int, output: str, atol: float = PARITY_ATOL) -> float:
    """Max |ONNX Runtime − PyTorch| of `output` on inputs of shapes unlike the traced one (parity_cases); raise
    above atol."""
    names = [i.name for i in load_onnx(onnx_path, weights=False).graph.input]
    return parity_of(parity_cases(graph, vocab, names), onnx_path, output, atol)


def _export_checked(
    parts: dict[str, Any],
    names: tuple[str, ...],
    output: str,
    vocab: int,
    path: Path,
    opset: int,
    atol: float,
    relative: bool = False,
) -> ExportResult:
    """Trace `parts`' "graph" (inputs `names`, which are input_ids and, when two, attention_mask) with the
    TorchScript-based exporter (its graph of a BERT runs faster in ONNX Runtime than the dynamo one's), or take the
    graph its "build" () makes from its weights (None: traced), check parity, record it in the metadata, then rename.
    `parts` is emptied here: the PyTorch graph goes once its parity outputs are made, before ONNX Runtime's session
    reads the file (and its model with it, where no one else holds it: an LM's weights twice otherwise)."""
    if opset < 17:
        raise CompressorError(f"opset must be ≥ 17, got {opset}")
    graph, build = parts.pop("graph"), parts.pop("build", None)
    path = Path(path)
    ids, mask = sample_inputs(vocab, 2, 7, seed=0)
    if hasattr(graph, "signature"):  # a graph with more inputs or outputs than its kind's contract names
        inputs, names, outputs, axes = graph.signature(ids, mask)
    else:
        inputs, names, outputs = (ids, mask)[: len(names)], list(names), [output]
        axes = {name: {0: "batch", 1: "sequence"} for name in (*names, output)}
    with atomic_file(path, needed=2 * tensor_bytes(graph.state_dict().values())) as tmp:
        with tempfile.TemporaryDirectory(prefix=f".{tmp.name}.", dir=tmp.parent) as scratch:
            with WeightFile(Path(scratch) / "weights") as weights:  # each weight written as it is made
                built = build(weights) if build is not None else None
            del build
            traced = built is None
            if traced:
                _trace(graph, inputs, tmp, opset, names, outputs, axes)
            cases = parity_cases(graph, vocab, list(names))
            del graph, inputs
            trim_heap()  # PyTorch's weights gone (where no one else holds them) before the graph is written and read
            if not traced:
                save_onnx(built, tmp)  # each weight copied from the scratch file as it is written
                del built
        parity = parity_of(cases, tmp, output, atol, relative)
        if traced:  # the exporter's file, its weights gathered beside it when they pass protobuf's limit
            save_onnx(load_onnx(tmp), tmp)
        add_props(tmp, {PARITY_KEY: repr(parity)})
    return ExportResult(path, parity)


def _trace(graph: nn.Module, inputs, path: Path, opset: int, names, outputs, axes) -> None:
    """`graph` as ONNX at `path` through the TorchScript-based exporter."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            graph,
            inputs,
            str(path),
            dynamo=False,
            opset_version=opset,
            input_names=names,
            output_names=outputs,
            dynamic_axes=axes,
        )


def export_onnx(
    model: nn.Module | list[nn.Module], path: Path, opset: int = 17, atol: float | None = None
) -> ExportResult:
    """A model as its kind's graph (an encoder: (input_ids, attention_mask) → last_hidden_state), parity-checked
    within `atol` (default: the kind's, GraphKind.parity_atol). `model` in a list that holds it alone is taken out of
    it: the model goes once PyTorch's outputs for the parity check are made, before ONNX Runtime's session reads
    its graph (an LM's weights in both at once: 4.9 GB at 0.5B)."""
    model = model.pop() if isinstance(model, list) else model
    kind = kind_of(model)
    vocab = model.get_input_embeddings().num_embeddings
    atol = kind.graph.parity_atol if atol is None else atol
    parts = {
        "graph": kind.export_graph(model).eval(),
        "build": functools.partial(kind.built_graph, model, opset),  # a decoder in ONNX Runtime's fused operators
    }
    del model
    relative = kind.graph.parity_relative
    return _export_checked(parts, kind.graph.inputs, kind.graph.output, vocab, path, opset, atol, relative)


def export_embedding_onnx(embedding: nn.Module, path: Path, opset: int = 17, atol: float = PARITY_ATOL) -> ExportResult:
    """An embedding alone as input_ids → (B, T, D) (named last_hidden_state), parity-checked."""
    graph = LookupGraph(embedding).eval()
    return _export_checked({"graph": graph}, graph.inputs, graph.output, embedding.num_embeddings, path, opset, atol)


def export_form_rows(values: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name suffix, values) of each graph that `values` asks for, a form option holding one form or
    a list (run): "" for a method's default form (the modules as they are), "-FORM" for each other."""
    every = export_forms().values()
    base = {**values, **{forms.option.dest: None for forms in every}}
    rows: dict[str, dict[str, Any]] = {}
    for forms in every:
        dest = forms.option.dest
        named = values.get(dest) or forms.default
        for form in named if isinstance(named, list) else [named]:
            rows.setdefault("" if form == forms.default else f"-{form}", {**base, dest: form})
    return list(rows.items()) or [("", values)]


def _chosen(values: dict[str, Any]) -> list[tuple[ExportForms, str]]:
    """(ExportForms, form) for each form other than its method's default that `values` names (one, or a list)."""
    chosen = []
    for forms in export_forms().values():
        named = values.get(forms.option.dest)
        chosen += [(forms, form) for form in (named if isinstance(named, list) else [named]) if form]
    return [(forms, form) for forms, form in chosen if form != forms.default]


def check_export_forms(values: dict[str, Any], model: nn.Module, plans: list[Plan] | None) -> None:
    """Before any work: each form chosen in `values` has modules to apply to among those the `plans`
    compress in `model` (none with a budget's plans, None), and its method's own check passes on each."""
    for forms, form in _chosen(values):
        jobs = [
            (model.get_submodule(name), cfg)
            for plan in plans or []
            for name, (_, cfg) in match_plan(plan, model).items()
            if method_of(cfg).export_forms is forms
        ]
        if not jobs:
            raise CompressorError(f"{forms.option.flag} {form} needs {forms.what}, and no plan makes one")
        for module, cfg in jobs:
            forms.check(form, values, module, cfg)


def in_export_form(model: nn.Module, values: dict[str, Any], frequencies: Callable[[], Calibration]) -> nn.Module:
    """`model` as the form options in `values` (by dest) ask: itself when they choose no form besides
    the default, else a copy with each (outermost) module a chosen form holds replaced by its export
    form (a model with none is refused). `frequencies()`: the calibration text's token counts."""
    chosen = _chosen(values)
    if not chosen:
        return model
    model = copy.deepcopy(model)
    for forms, form in chosen:
        names: list[str] = []
        for name, module in model.named_modules():
            if forms.holds(module) and not any(name.startswith(f"{outer}.") for outer in names):
                names.append(name)
        if not names:
            raise CompressorError(f"{forms.option.flag} {form} needs a model with {forms.what}; this one has none")
        for name in names:
            set_submodule(model, name, forms.prepare(model.get_submodule(name), form, values, frequencies))
    kind_of(model).tie_(model)  # a tied head now reads the exported form
    return model
