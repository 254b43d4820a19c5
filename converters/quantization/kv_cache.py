"""An int8 key-value cache for the fused decoder's graph (fused_decoder.py): each GroupQueryAttention stores its
layer's keys and values as q = clip(round(x / s), −127, 127) with one scale per key-value head and channel,
s = max |x| / 127 over calibration text (k_quant_type = v_quant_type = PER_CHANNEL, kv_cache_bit_width 8), and
its pasts and presents are int8: a quarter of the fp32 cache's bytes read a token (SmolLM2-135M at context 512:
5.9 MB for 23.6). ONNX Runtime's CPU kernel writes the new keys and values rounded and attends over the rounded
cache; a prompt's first pass attends over its own keys and values in float."""

import itertools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from compressor.errors import CompressorError
from eval.graph import numbers_session
from eval.probe import PAST, PRESENT, full_feed

__all__ = ["CACHE_PASSAGES", "CACHE_TYPES", "attends_by_gqa", "cache_scales", "int8_cache"]

CACHE_TYPES = ("fp32", "int8")
CACHE_PASSAGES = 64  # calibration passages whose keys and values set the scales
K_SCALE, V_SCALE = 12, 13  # GroupQueryAttention's inputs k_scale and v_scale


def _attention_of(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """Each GroupQueryAttention node by the present key it writes."""
    return {n.output[1]: n for n in model.graph.node if n.op_type == "GroupQueryAttention" and len(n.output) > 1}


def attends_by_gqa(model: onnx.ModelProto) -> bool:
    """Whether every present key of the graph is written by a GroupQueryAttention (the fused decoder's graph)."""
    keys = [o.name for o in model.graph.output if o.name.startswith(PRESENT) and o.name.endswith(".key")]
    return bool(keys) and set(keys) <= set(_attention_of(model))


def cache_scales(graph: Path, batches: list[dict], rows: int = CACHE_PASSAGES) -> dict[str, np.ndarray]:
    """Per present (present.{i}.key / .value): (1, kv_heads, 1, head_dim) scales, max |x| / 127 over the real
    tokens of the first `rows` rows of `batches` (each read alone, its padding dropped), as the graph at `graph`
    computes them."""
    session = numbers_session(graph)
    peak: dict[str, np.ndarray] = {}
    names = [o.name for o in session.get_outputs()]
    pairs = ((ids, mask) for batch in batches for ids, mask in zip(batch["input_ids"], batch["attention_mask"]))
    for ids, mask in itertools.islice(pairs, rows):
        row = ids[mask.astype(bool)][None]
        out = session.run(None, full_feed(session, {"input_ids": row, "attention_mask": np.ones_like(row)}))
        for name, value in zip(names, out):
            if name.startswith(PRESENT):
                top = np.abs(value).max(axis=(0, 2), keepdims=True)
                peak[name] = top if name not in peak else np.maximum(peak[name], top)
    return {name: np.maximum(top, 1e-8).astype(np.float32) / 127 for name, top in peak.items()}


def int8_cache(model: onnx.ModelProto, scales: dict[str, np.ndarray]) -> onnx.ModelProto:
    """`model` (the fused decoder's graph) with int8 pasts and presents at `scales` (cache_scales), in place."""
    if not attends_by_gqa(model):
        raise CompressorError(
            "an int8 key-value cache is written into the fused decoder's GroupQueryAttention; this graph attends "
            "otherwise (the PyTorch exporter's): export a Llama-style LM whose graph is the fused decoder, or keep "
            "--kv-cache fp32"
        )
    for key, node in _attention_of(model).items():
        value = node.output[2]
        node.attribute.extend(
            [
                onnx.helper.make_attribute("k_quant_type", "PER_CHANNEL"),
                onnx.helper.make_attribute("v_quant_type", "PER_CHANNEL"),
                onnx.helper.make_attribute("kv_cache_bit_width", 8),
            ]
        )
        while len(node.input) <= V_SCALE:
            node.input.append("")
        for index, name in ((K_SCALE, key), (V_SCALE, value)):
            node.input[index] = f"{name}.scale"
            model.graph.initializer.append(numpy_helper.from_array(scales[name], f"{name}.scale"))
    for io in (*model.graph.input, *model.graph.output):
        if io.name.startswith((PAST, PRESENT)):
            io.type.tensor_type.elem_type = TensorProto.INT8
    return model
