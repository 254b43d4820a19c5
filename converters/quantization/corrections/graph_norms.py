"""The norms a trained scheme's student trains (training.student_of) and writes back into the graph: each LayerNorm
a LayerNormalization node computes, y = (x − μ) / σ · γ + β, and each RMS norm (Llama's) a fused
SimplifiedLayerNormalization or SkipSimplifiedLayerNormalization node computes, y = x / rms(x) · γ, found by their
values (one module holding them, one node reading them), their constants moved into initializers of their own."""

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from converters.submodules import set_submodule

__all__ = ["GraphLayerNorm", "GraphRMSNorm", "norms_of", "own_initializers"]

_RMS_SCALE = {"SimplifiedLayerNormalization": 1, "SkipSimplifiedLayerNormalization": 2}  # γ's input position


class GraphLayerNorm(nn.LayerNorm):
    """A LayerNorm of the student whose weight and bias go back into the graph's LayerNormalization."""


class GraphRMSNorm(nn.Module):
    """An RMS norm of the student, y = x / sqrt(mean(x²) + eps) · γ (in fp32, as Llama's), whose γ goes back into
    the graph's (Skip)SimplifiedLayerNormalization."""

    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def own_initializers(graph: onnx.GraphProto, node: onnx.NodeProto, positions: dict[int, str]) -> list[np.ndarray]:
    """The constant inputs of `node` at `positions` (index → new name), each moved (in place) into an
    initializer of its own under the new name (the exporter may share one initializer between equal
    values, through Identity nodes), the old one removed where no node reads it any more; their values, or []
    when one of them is no constant."""
    inits = {i.name: i for i in graph.initializer}
    sources = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Identity" and n.input[0] in inits}
    found = {k: sources.get(node.input[k], node.input[k]) for k in positions}
    if not all(name in inits for name in found.values()):
        return []
    values = [numpy_helper.to_array(inits[found[k]]).copy() for k in positions]
    for (k, name), value in zip(positions.items(), values):
        graph.initializer.append(numpy_helper.from_array(value, name))
        node.input[k] = name
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for old in set(found.values()) - used:  # no node reads it any more: not stored twice
        graph.initializer.remove(inits[old])
    return values


def _rms_eps(module: nn.Module) -> float | None:
    """The eps of an RMS norm that computes x / rms(x) · weight (Llama's: variance_epsilon), else None (Gemma's
    (1 + weight) is not: its values would not match the graph's γ either)."""
    eps = getattr(module, "variance_epsilon", None)
    plain = type(module).__name__.endswith("RMSNorm") and isinstance(getattr(module, "weight", None), nn.Parameter)
    return float(eps) if plain and eps is not None else None


def norms_of(model: nn.Module, graph: onnx.GraphProto) -> dict[str, tuple[str, ...]]:
    """Each LayerNorm and RMS norm of `model` that one node of `graph` computes, made a GraphLayerNorm or
    GraphRMSNorm (in place), its constants moved into initializers of their own: module name → (scale
    initializer, bias initializer) or (scale initializer,)."""
    held: dict[bytes, list[str]] = {}
    for name, m in model.named_modules():
        if type(m) is nn.LayerNorm and m.weight is not None and m.bias is not None:
            held.setdefault(_key(m.weight, m.bias), []).append(name)
        elif _rms_eps(m) is not None:
            held.setdefault(_key(m.weight), []).append(name)
    inits = {i.name: i for i in graph.initializer}
    sources = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Identity"}
    norms = {}
    for k, node in enumerate(graph.node):
        if node.op_type == "LayerNormalization" and len(node.input) >= 3:
            positions = {1: f"layer_norm_{k}_scale", 2: f"layer_norm_{k}_bias"}
        elif node.op_type in _RMS_SCALE and len(node.input) > _RMS_SCALE[node.op_type]:
            positions = {_RMS_SCALE[node.op_type]: f"rms_norm_{k}_scale"}
        else:
            continue
        names = [sources.get(node.input[i], node.input[i]) for i in positions]
        if not all(n in inits for n in names):
            continue
        key = np.concatenate([numpy_helper.to_array(inits[n]) for n in names]).astype(np.float32).tobytes()
        if len(held.get(key, [])) != 1:
            continue  # no single norm of the model holds these values: left as it is
        (name,) = held.pop(key)
        own_initializers(graph, node, positions)
        old = model.get_submodule(name)
        if type(old) is nn.LayerNorm:
            norm = GraphLayerNorm(old.normalized_shape, eps=old.eps)
            norm.load_state_dict(old.state_dict())
        else:
            norm = GraphRMSNorm(old.weight, _rms_eps(old))
        set_submodule(model, name, norm)
        norms[name] = tuple(positions.values())
    return norms


def _key(*values: torch.Tensor) -> bytes:
    return torch.cat([v.detach().float() for v in values]).numpy().tobytes()
