"""The cached graph of a Llama-style decoder written from its weights in ONNX Runtime's fused operators,
the layout of ONNX Runtime GenAI's model builder: per layer one SimplifiedLayerNormalization (the
residual add fused in, SkipSimplifiedLayerNormalization), one MatMul for q, k and v together, one
GroupQueryAttention (rotary positions from the mask's lengths, the cache concatenated inside), the
o, gate, up and down MatMuls and SiLU as x·σ(x). The PyTorch exporter's graph of the same model holds
~7,000 nodes, half of them shape arithmetic that at one token a step is the time; this one holds
~11 a layer. Inputs and outputs are CausalLMGraph's but for position_ids, which the mask gives:

    (input_ids (B, T), attention_mask (B, past + T), past_key_values.{i}.key / .value (B, kv_heads, past,
    head_dim)) → (logits (B, T, V), present.{i}.key / .value (B, kv_heads, past + T, head_dim))

The attention mask must be ones after padding on the right (GroupQueryAttention counts each row's
tokens, it does not read holes). Models outside this form (other blocks, a compressed layer, biases
on o or the MLP, another activation) get None and the PyTorch exporter's graph."""

import re

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from compressor.tied_logits import TiedLogits
from converters.nbits_storage import TABLE_OPSET, dequantize_nbits
from eval.probe import PAST, PRESENT
from files.onnx_files import WeightFile

__all__ = ["fits_fused", "fused_decoder", "rounded_twin"]

MS = "com.microsoft"


def _plain(module) -> bool:
    return type(module) is nn.Linear


def fits_fused(model: nn.Module) -> bool:
    """A Llama-style decoder of plain layers: q, k, v (biases allowed), o, gate, up, down without
    bias, RMS norms, SiLU, rotary positions over whole heads, attention over the whole past, a dense or
    tied dense head."""
    body = getattr(model, "model", None)
    config = getattr(model, "config", None)
    if body is None or config is None or getattr(config, "hidden_act", None) != "silu":
        return False
    if not isinstance(getattr(body, "embed_tokens", None), nn.Embedding) or not hasattr(body, "rotary_emb"):
        return False
    if _head_dim(config) % 16:  # GroupQueryAttention's CPU kernel takes heads of a multiple of 16 dimensions
        return False
    if getattr(config, "partial_rotary_factor", 1.0) != 1.0:  # the caches rotate whole heads
        return False
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False  # attention over a window: not written (local_window_size would be)
    head = model.get_output_embeddings()
    dense_head = _plain(head) and head.bias is None
    tied_head = isinstance(head, TiedLogits) and head.score == "dot" and head.bias is None
    tied_head = tied_head and head.embedding is body.embed_tokens
    if not (dense_head or tied_head):
        return False
    for layer in body.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        linears = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        linears += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if not all(_plain(m) for m in linears) or any(m.bias is not None for m in linears[3:]):
            return False
        if getattr(attn, "q_norm", None) is not None:  # Qwen3's per-head norms: not in this form
            return False
    return True


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _rotary_caches(model: nn.Module, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(max positions, head_dim / 2) cos and sin of the model's own rotary embedding (its scaling included)."""
    length = model.config.max_position_embeddings
    x = torch.zeros(1, 1, head_dim)
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(x, torch.arange(length).unsqueeze(0))
    half = head_dim // 2
    return cos[0, :, :half].float().numpy(), sin[0, :, :half].float().numpy()


def fused_decoder(model: nn.Module, opset: int = 17, weights: WeightFile | None = None) -> onnx.ModelProto | None:
    """`model` (a Llama-style causal LM) as the fused cached graph at `opset` or 21, the later, or None when
    it is not of that form. (From 21 the 4-bit stage needs no conversion, which does not know
    SimplifiedLayerNormalization, an ONNX Runtime operator in ONNX's domain.) With `weights`, each weight is written
    there as it is made and the graph refers to it (a 0.5B LM's PyTorch weights and its graph's were 4 GB at once)."""
    if not fits_fused(model):
        return None
    config, body = model.config, model.model
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = _head_dim(config)
    layers = len(body.layers)
    # each weight written into the model as it is made (a list of them, a graph of the list and a model of the graph
    # held a 0.5B LM's 2 GB three times)
    proto = onnx.ModelProto()
    nodes: list[onnx.NodeProto] = []

    def weight(name: str, array, dtype=np.float32) -> str:
        tensor = numpy_helper.from_array(np.ascontiguousarray(array, dtype=dtype), name)
        proto.graph.initializer.append(tensor if weights is None else weights.add(tensor))
        return name

    def node(op: str, inputs: list[str], outputs: list[str], name: str, domain: str = "", **attrs):
        nodes.append(helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs))
        return outputs[0]

    def matmul(x: str, linears: list[nn.Linear], name: str) -> str:
        """x Wᵀ (+ b) with the linears' weights side by side: one MatMul of a (in, Σ out) initializer."""
        w = torch.cat([m.weight.detach() for m in linears]).T.numpy()
        out = node("MatMul", [x, weight(f"{name}.weight", w)], [f"/{name}/MatMul/output_0"], f"/{name}/MatMul")
        if linears[0].bias is not None:
            b = torch.cat([m.bias.detach() for m in linears]).numpy()
            out = node("Add", [out, weight(f"{name}.bias", b)], [f"/{name}/Add/output_0"], f"/{name}/Add")
        return out

    def norm(name: str, module, x: str, skip: str | None = None) -> tuple[str, str | None]:
        """RMS norm of x (+ skip): (the normed, the sum when skip is given)."""
        w = weight(f"{name}.weight", module.weight.detach().numpy())
        eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))
        if skip is None:
            return node("SimplifiedLayerNormalization", [x, w], [f"/{name}/output_0"], f"/{name}", epsilon=eps), None
        outs = [f"/{name}/output_0", "", "", f"/{name}/output_3"]
        node("SkipSimplifiedLayerNormalization", [x, skip, w], outs, f"/{name}", domain=MS, epsilon=eps)
        return outs[0], outs[3]

    one = weight("/constants/one", [1], np.int64)
    lengths = node("ReduceSum", ["attention_mask", one], ["/mask/ReduceSum/output_0"], "/mask/ReduceSum", keepdims=0)
    lengths = node("Sub", [lengths, one], ["/mask/Sub/output_0"], "/mask/Sub")
    seqlens = node("Cast", [lengths], ["/mask/seqlens_k"], "/mask/Cast", to=TensorProto.INT32)
    shape = node("Shape", ["attention_mask"], ["/mask/Shape/output_0"], "/mask/Shape")
    index = weight("/constants/scalar_one", 1, np.int64)
    total = node("Gather", [shape, index], ["/mask/Gather/output_0"], "/mask/Gather", axis=0)
    total = node("Cast", [total], ["/mask/total_sequence_length"], "/mask/Cast_1", to=TensorProto.INT32)
    cos, sin = _rotary_caches(model, head_dim)
    weight("cos_cache", cos), weight("sin_cache", sin)

    table = weight("model.embed_tokens.weight", body.embed_tokens.weight.detach().numpy())
    hidden = node("Gather", [table, "input_ids"], ["/embed_tokens/output_0"], "/embed_tokens/Gather")
    residual, mlp_out = hidden, None
    kv = [f"{i}.{k}" for i in range(layers) for k in ("key", "value")]
    for i, layer in enumerate(body.layers):
        attn, mlp, prefix = layer.self_attn, layer.mlp, f"model.layers.{i}"
        x, summed = norm(f"{prefix}.input_layernorm", layer.input_layernorm, residual, mlp_out)
        residual = summed or residual
        qkv = matmul(x, [attn.q_proj, attn.k_proj, attn.v_proj], f"{prefix}.attn.qkv_proj")
        past = [f"{PAST}{i}.key", f"{PAST}{i}.value"]
        attended = node(
            "GroupQueryAttention",
            [qkv, "", "", *past, seqlens, total, "cos_cache", "sin_cache"],
            [f"/{prefix}/attn/output_0", f"{PRESENT}{i}.key", f"{PRESENT}{i}.value"],
            f"/{prefix}/attn/GroupQueryAttention",
            domain=MS,
            num_heads=heads,
            kv_num_heads=kv_heads,
            scale=float(getattr(attn, "scaling", head_dim**-0.5)),
            do_rotary=1,
            rotary_interleaved=0,
            local_window_size=-1,
        )
        o = matmul(attended, [attn.o_proj], f"{prefix}.attn.o_proj")
        y, residual = norm(f"{prefix}.post_attention_layernorm", layer.post_attention_layernorm, residual, o)
        gate = matmul(y, [mlp.gate_proj], f"{prefix}.mlp.gate_proj")
        up = matmul(y, [mlp.up_proj], f"{prefix}.mlp.up_proj")
        sigmoid = node("Sigmoid", [gate], [f"/{prefix}/mlp/Sigmoid/output_0"], f"/{prefix}/mlp/Sigmoid")
        silu = node("Mul", [gate, sigmoid], [f"/{prefix}/mlp/act/output_0"], f"/{prefix}/mlp/act")
        product = node("Mul", [silu, up], [f"/{prefix}/mlp/Mul/output_0"], f"/{prefix}/mlp/Mul")
        mlp_out = matmul(product, [mlp.down_proj], f"{prefix}.mlp.down_proj")
    out, _ = norm("model.norm", body.norm, residual, mlp_out)
    head = model.get_output_embeddings()
    if isinstance(head, TiedLogits):  # the table stored once: x Eᵀ as FusedMatMul(x, E, transB=1)
        node("FusedMatMul", [out, table], ["logits"], "/lm_head/FusedMatMul", domain=MS, transB=1)
    else:
        nodes.append(helper.make_node("Identity", [matmul(out, [head], "lm_head")], ["logits"], name="/lm_head/out"))

    float_, int64 = TensorProto.FLOAT, TensorProto.INT64
    inputs = [
        helper.make_tensor_value_info("input_ids", int64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", int64, ["batch", "past_sequence + sequence"]),
        *(helper.make_tensor_value_info(PAST + n, float_, ["batch", kv_heads, "past_sequence", head_dim]) for n in kv),
    ]
    vocab = body.embed_tokens.num_embeddings
    total_shape = ["batch", kv_heads, "past_sequence + sequence", head_dim]
    outputs = [
        helper.make_tensor_value_info("logits", float_, ["batch", "sequence", vocab]),
        *(helper.make_tensor_value_info(PRESENT + n, float_, total_shape) for n in kv),
    ]
    integers = {lengths: int64, "/mask/ReduceSum/output_0": int64, shape: int64, "/mask/Gather/output_0": int64}
    integers.update({seqlens: TensorProto.INT32, total: TensorProto.INT32})
    declared = {v.name for v in outputs}
    typed = [  # element types of what ONNX's shape inference cannot see through the contrib operators
        helper.make_tensor_value_info(name, integers.get(name, float_), None)
        for n in nodes
        for name in n.output
        if name and name not in declared
    ]
    proto.graph.name = "fused_decoder"
    proto.graph.node.extend(nodes)
    proto.graph.input.extend(inputs)
    proto.graph.output.extend(outputs)
    proto.graph.value_info.extend(typed)
    proto.opset_import.extend([helper.make_opsetid("", max(opset, TABLE_OPSET)), helper.make_opsetid(MS, 1)])
    proto.producer_name = "compressor"
    # not the newest onnx's IR version: older runtimes load it
    proto.ir_version = helper.find_min_ir_version_for(proto.opset_import, ignore_unknown=True)
    return proto


_LAYER = re.compile(
    r"model\.layers\.(\d+)\.(attn\.qkv_proj|attn\.o_proj|mlp\.gate_proj|mlp\.up_proj|mlp\.down_proj)\.weight"
)
_TIED = "model.embed_tokens.weight_transposed"  # products.products_as_matmul's copy of the tied table


def rounded_twin(model: nn.Module, graph: onnx.GraphProto) -> nn.Module:
    """`model` (in place) holding each weight as `graph`, its fused graph in plain 4 or 8 bits (`--quantize
    int4`: no smoothing, no corrections), multiplies by: each MatMulNBits weight read back from its codes,
    the q/k/v product split into its projections, a tied table the head's (quantization.storage.tied_codes)."""
    if any(n.output[0].endswith(("/smoothed", "_rounded")) for n in graph.node):
        raise ValueError("a smoothed or corrected graph computes what no weights of this model hold")
    codes = {n.input[1] for n in graph.node if n.op_type == "MatMulNBits"}
    if any(n.op_type == "GatherBlockQuantized" and n.input[0] not in codes for n in graph.node):
        raise ValueError("the table has codes of its own (an untied LM): read back here are the MatMuls' only")
    layers = model.model.layers
    for node in graph.node:
        if node.op_type != "MatMulNBits":
            continue
        name = re.sub(r"_Q\d+(G\d+)?$", "", node.input[1])
        weight = torch.from_numpy(dequantize_nbits(graph, node).T.astype(np.float32)).contiguous()  # (out, in)
        found = _LAYER.fullmatch(name)
        if name in (_TIED, "lm_head.weight"):
            (model.get_input_embeddings() if name == _TIED else model.lm_head).weight.data = weight
        elif found is None:
            raise ValueError(f"{name!r} is no weight of a fused Llama-style graph")
        elif found[2] == "attn.qkv_proj":
            attn = layers[int(found[1])].self_attn
            parts = [attn.q_proj, attn.k_proj, attn.v_proj]
            for module, part in zip(parts, weight.split([m.out_features for m in parts])):
                module.weight.data = part.contiguous()
        else:
            layers[int(found[1])].get_submodule(found[2].replace("attn.", "self_attn.")).weight.data = weight
    return model
