"""ONNX export of an encoder (input_ids, attention_mask → last_hidden_state), opset ≥ 17 with
dynamic batch and sequence axes, checked against PyTorch in ONNX Runtime on ids and shapes the
tracer never saw before the file takes its final name."""

import inspect
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import Tensor, nn

from compressor.errors import CompressorError, ExportParityError
from converters.atomic import atomic_file

__all__ = [
    "EncoderGraph",
    "LookupGraph",
    "ExportResult",
    "export_onnx",
    "export_embedding_onnx",
    "check_parity",
    "PARITY_ATOL",
    "TWO_GB",
]

PARITY_ATOL = 1e-4
TWO_GB = 2**31
INPUTS = ("input_ids", "attention_mask")
OUTPUT = "last_hidden_state"


class EncoderGraph(nn.Module):
    """The graph's contract: (input_ids, attention_mask) → last_hidden_state (B, T, H)."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class LookupGraph(nn.Module):
    """An embedding alone: input_ids → (B, T, D), for measuring a lookup."""

    def __init__(self, embedding: nn.Module):
        super().__init__()
        self.embedding = embedding

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.embedding(input_ids)


@dataclass(frozen=True)
class ExportResult:
    path: Path
    parity_max_abs: float


def _sample_inputs(vocab: int, batch: int, seq: int, seed: int) -> tuple[Tensor, Tensor]:
    """Random ids with the first and last real tokens present, and a padded row."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    ids[0, 0], ids[-1, -1] = vocab - 1, 0
    mask = torch.ones_like(ids)
    mask[-1, seq // 2 :] = 0
    return ids, mask


def check_parity(graph: nn.Module, onnx_path: Path, vocab: int, atol: float = PARITY_ATOL) -> float:
    """Max |ONNX Runtime − PyTorch| on inputs of shapes unlike the traced one; raise above atol."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    worst = 0.0
    for batch, seq, seed in ((3, 13, 1), (1, 5, 2)):
        inputs = _sample_inputs(vocab, batch, seq, seed)[: len(names)]
        with torch.no_grad():
            expected = graph(*inputs).numpy()
        (got,) = session.run([OUTPUT], {n: x.numpy() for n, x in zip(names, inputs)})
        if got.shape != expected.shape:
            raise ExportParityError(
                f"ONNX output shape {got.shape} differs from PyTorch's {expected.shape} at input shape {(batch, seq)}"
            )
        worst = max(worst, float(np.abs(got - expected).max()))
    if not worst <= atol:
        raise ExportParityError(
            f"ONNX Runtime and PyTorch differ by {worst:.3g} on {OUTPUT}, above the tolerance {atol:g}"
        )
    return worst


def _export_checked(graph: nn.Module, vocab: int, path: Path, opset: int, atol: float) -> ExportResult:
    """Trace with the TorchScript-based exporter (its graph of a BERT runs faster in ONNX
    Runtime than the dynamo one's), check parity, record it in the metadata, then rename."""
    if opset < 17:
        raise CompressorError(f"opset must be ≥ 17, got {opset}")
    path = Path(path)
    names = list(INPUTS[: len(inspect.signature(graph.forward).parameters)])
    with atomic_file(path) as tmp:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                graph,
                _sample_inputs(vocab, 2, 7, seed=0)[: len(names)],
                str(tmp),
                dynamo=False,
                opset_version=opset,
                input_names=names,
                output_names=[OUTPUT],
                dynamic_axes={name: {0: "batch", 1: "sequence"} for name in (*names, OUTPUT)},
            )
        parity = check_parity(graph, tmp, vocab, atol)
        proto = onnx.load(str(tmp))
        onnx.helper.set_model_props(proto, {"compressor.parity_max_abs": repr(parity)})
        onnx.save_model(
            proto,
            str(tmp),
            save_as_external_data=proto.ByteSize() > TWO_GB,
            location=f"{path.name}.data",
        )
    return ExportResult(path, parity)


def export_onnx(model: nn.Module, path: Path, opset: int = 17, atol: float = PARITY_ATOL) -> ExportResult:
    """An encoder as (input_ids, attention_mask) → last_hidden_state, parity-checked."""
    vocab = model.get_input_embeddings().num_embeddings
    return _export_checked(EncoderGraph(model).eval(), vocab, path, opset, atol)


def export_embedding_onnx(embedding: nn.Module, path: Path, opset: int = 17, atol: float = PARITY_ATOL) -> ExportResult:
    """An embedding alone as input_ids → (B, T, D) (named last_hidden_state), parity-checked."""
    return _export_checked(LookupGraph(embedding).eval(), embedding.num_embeddings, path, opset, atol)
