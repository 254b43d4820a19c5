"""The cached graph of a Llama-style decoder written from its weights in ONNX Runtime's fused operators,
the layout of ONNX Runtime GenAI's model builder: per layer one SimplifiedLayerNormalization (the
residual add fused in, SkipSimplifiedLayerNormalization), one MatMul for q, k and v together, one
GroupQueryAttention (rotary positions from the mask's lengths, the cache concatenated inside), the
o, gate, up and down MatMuls and SiLU as x·σ(x). The PyTorch exporter's graph of the same model holds
~7,000 nodes, half of them shape arithmetic that at one token a step is the time; this one holds
~11 a layer. Inputs and outputs are CausalLMGraph's but for position_ids, which the mask gives:

    (input_ids (B, T), attention_mask (B, past + T), past_key_values.{i}.key / .value (B, kv_heads, past,
    head_dim)) → (logits (B, T, V), present.{i}.key / .value (B, kv_heads, past + T, head_dim))

Gemma 3's text LMs take the same form with what Gemma adds (Gemma Team 2025): the table's rows scaled
by √width as they are read (the tied head multiplies by the table as stored), RMS norms by (1 + w), a
norm on each head's query and key before the rotation, norms after the attention and after the MLP
as well as before them, the MLP's gate through GELU's tanh form (FastGelu), and its local layers
attending to the last `sliding_window` positions (GroupQueryAttention's local_window_size) with
rotary positions of their own base, every sixth layer attending to the whole past.

The attention mask must be ones after padding on the right (GroupQueryAttention counts each row's
tokens, it does not read holes). Models outside this form (other blocks, a compressed layer, biases
on o or the MLP, another activation) get None and the PyTorch exporter's graph; `unfused_reason`
says which of their parts it is."""

import inspect
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

__all__ = ["fits_fused", "fused_decoder", "rounded_twin", "unfused_reason"]

MS = "com.microsoft"


ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # SwiGLU's gate, and GeGLU's with GELU's tanh form (Gemma)


def _plain(module) -> bool:
    return type(module) is nn.Linear


def _activation(config) -> str | None:
    return getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)


def _gemma(module) -> bool:
    """Whether a norm is Gemma's, x / rms(x) · (1 + w)."""
    return type(module).__name__.startswith("Gemma")


def _sandwich(layer) -> bool:
    """Whether a layer norms what its attention and its MLP give too (Gemma 2 and 3: four norms a layer)."""
    return getattr(layer, "pre_feedforward_layernorm", None) is not None


def _window(config, i: int) -> int:
    """The positions layer `i` attends to (its own included), −1 for the whole past."""
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if (
        types is None
        or not window
        or not getattr(config, "use_sliding_window", True)
        or types[i] != "sliding_attention"
    ):
        return -1
    return int(window)


def unfused_reason(model: nn.Module) -> str | None:
    """None when `model` is a decoder of the fused form: plain q, k, v (biases allowed), o, gate, up, down without
    bias, RMS norms, SiLU or GELU-tanh gates, rotary positions over whole heads, attention over the whole past or a
    window on the layers `layer_types` names (Gemma 3), a dense or tied dense head; else which part is not, in a
    few words."""
    body = getattr(model, "model", None)
    config = getattr(model, "config", None)
    if body is None or config is None or not hasattr(body, "layers"):
        return "it is no decoder of transformers' kind (model.model.layers)"
    if _activation(config) not in ACTIVATIONS:
        return f"its MLP's activation {_activation(config)!r} is none of {', '.join(ACTIVATIONS)}"
    if not isinstance(getattr(body, "embed_tokens", None), nn.Embedding) or not hasattr(body, "rotary_emb"):
        return "its table is no plain embedding or it has no rotary positions"
    if _head_dim(config) % 16:  # GroupQueryAttention's CPU kernel takes heads of a multiple of 16 dimensions
        return f"its heads of {_head_dim(config)} dimensions are no multiple of 16"
    if getattr(config, "partial_rotary_factor", 1.0) != 1.0:  # the caches rotate whole heads
        return "its rotary positions turn part of each head (partial_rotary_factor)"
    windowed = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    if windowed and getattr(config, "layer_types", None) is None:
        return "its sliding_window names no layers (layer_types)"
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, name, None):
            return f"its {name} is set"
    if getattr(config, "use_bidirectional_attention", False):
        return "its attention is bidirectional (use_bidirectional_attention)"
    head = model.get_output_embeddings()
    dense_head = _plain(head) and head.bias is None
    tied_head = isinstance(head, TiedLogits) and head.score == "dot" and head.bias is None
    tied_head = tied_head and head.embedding is body.embed_tokens
    if not (dense_head or tied_head):
        return "its head is no plain or tied dense product"
    for i, layer in enumerate(body.layers):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        linears = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        linears += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if not all(_plain(m) for m in linears) or any(m.bias is not None for m in linears[3:]):
            return f"layer {i}'s linear layers are not all plain (compressed, or o and the MLP with biases)"
        if (getattr(attn, "q_norm", None) is not None) != _sandwich(layer):  # Qwen3's head norms without Gemma's
            return f"layer {i} norms its heads without norming its attention's output, as Qwen3 does"
    return None


def fits_fused(model: nn.Module) -> bool:
    """Whether `model` is written as the fused decoder (unfused_reason is None)."""
    return unfused_reason(model) is None


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _rotary_caches(model: nn.Module, head_dim: int, layer_type: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(max positions, head_dim / 2) cos and sin of the model's own rotary embedding (its scaling included), for the
    layers of `layer_type` where the model has one base a type (Gemma 3's local and global layers)."""
    length = model.config.max_position_embeddings
    x = torch.zeros(1, 1, head_dim)
    kind = {} if layer_type is None else {"layer_type": layer_type}
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(x, torch.arange(length).unsqueeze(0), **kind)
    half = head_dim // 2
    return cos[0, :, :half].float().numpy(), sin[0, :, :half].float().numpy()


def fused_decoder(model: nn.Module, opset: int = 17, weights: WeightFile | None = None) -> onnx.ModelProto | None:
    """`model` (a Llama- or Gemma-3-style causal LM) as the fused cached graph at `opset` or 21, the later, or None
    when it is not of that form. (From 21 the 4-bit stage needs no conversion, which does not know
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
        array = np.ascontiguousarray(array, dtype=dtype)
        tensor = numpy_helper.from_array(array, name) if weights is None else weights.add_array(name, array)
        proto.graph.initializer.append(tensor)
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
        """RMS norm of x (+ skip) over its last axis: (the normed, the sum when skip is given)."""
        w = weight(f"{name}.weight", module.weight.detach().numpy() + (1.0 if _gemma(module) else 0.0))
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
    typed_rotary = "layer_type" in inspect.signature(body.rotary_emb.forward).parameters
    caches = {}  # layer type (None: every layer's) → its cos and sin caches
    for kind in sorted(set(config.layer_types)) if typed_rotary else [None]:
        names = ("cos_cache", "sin_cache") if kind is None else (f"cos_cache_{kind}", f"sin_cache_{kind}")
        caches[kind] = [weight(n, a) for n, a in zip(names, _rotary_caches(model, head_dim, kind))]

    table = weight("model.embed_tokens.weight", body.embed_tokens.weight.detach().numpy())
    hidden = node("Gather", [table, "input_ids"], ["/embed_tokens/output_0"], "/embed_tokens/Gather")
    scale = getattr(body.embed_tokens, "embed_scale", None)  # Gemma's √width: the table stored as the head reads it
    if scale is not None:
        factor = weight("/embed_tokens/scale", float(scale))
        hidden = node("Mul", [hidden, factor], ["/embed_tokens/Mul/output_0"], "/embed_tokens/Mul")
    gelu = _activation(config) == "gelu_pytorch_tanh"
    head_norms = any(getattr(layer.self_attn, "q_norm", None) is not None for layer in body.layers)
    if head_norms:
        by_head = weight("/constants/by_head", [0, 0, -1, head_dim], np.int64)
        flat = weight("/constants/flat", [0, 0, -1], np.int64)

    def head_norm(name: str, module, x: str) -> str:
        """x (B, T, heads · head_dim) with each head RMS-normed alone (Gemma 3's q_norm and k_norm)."""
        split = node("Reshape", [x, by_head], [f"/{name}/Reshape/output_0"], f"/{name}/Reshape")
        normed, _ = norm(name, module, split)
        return node("Reshape", [normed, flat], [f"/{name}/Reshape_1/output_0"], f"/{name}/Reshape_1")

    residual, mlp_out = hidden, None
    kv = [f"{i}.{k}" for i in range(layers) for k in ("key", "value")]
    for i, layer in enumerate(body.layers):
        attn, mlp, prefix = layer.self_attn, layer.mlp, f"model.layers.{i}"
        sandwich = _sandwich(layer)
        x, summed = norm(f"{prefix}.input_layernorm", layer.input_layernorm, residual, mlp_out)
        residual = summed or residual
        projections = [attn.q_proj, attn.k_proj, attn.v_proj]
        qkv = [matmul(x, projections, f"{prefix}.attn.qkv_proj"), "", ""]
        if getattr(attn, "q_norm", None) is not None:  # q, k and v apart, q and k normed a head at a time
            sizes = weight(f"/{prefix}/attn/sizes", [m.out_features for m in projections], np.int64)
            parts = [f"/{prefix}/attn/Split/output_{j}" for j in range(3)]
            node("Split", [qkv[0], sizes], parts, f"/{prefix}/attn/Split", axis=-1)
            qkv = [head_norm(f"{prefix}.attn.q_norm", attn.q_norm, parts[0])]
            qkv += [head_norm(f"{prefix}.attn.k_norm", attn.k_norm, parts[1]), parts[2]]
        past = [f"{PAST}{i}.key", f"{PAST}{i}.value"]
        rotary = caches[config.layer_types[i] if typed_rotary else None]
        attended = node(
            "GroupQueryAttention",
            [*qkv, *past, seqlens, total, *rotary],
            [f"/{prefix}/attn/output_0", f"{PRESENT}{i}.key", f"{PRESENT}{i}.value"],
            f"/{prefix}/attn/GroupQueryAttention",
            domain=MS,
            num_heads=heads,
            kv_num_heads=kv_heads,
            scale=float(getattr(attn, "scaling", head_dim**-0.5)),
            do_rotary=1,
            rotary_interleaved=0,
            local_window_size=_window(config, i),
        )
        o = matmul(attended, [attn.o_proj], f"{prefix}.attn.o_proj")
        if sandwich:  # Gemma: the attention's output normed, then the MLP's input normed from the sum
            o, _ = norm(f"{prefix}.post_attention_layernorm", layer.post_attention_layernorm, o)
            y, residual = norm(f"{prefix}.pre_feedforward_layernorm", layer.pre_feedforward_layernorm, residual, o)
        else:
            y, residual = norm(f"{prefix}.post_attention_layernorm", layer.post_attention_layernorm, residual, o)
        gate = matmul(y, [mlp.gate_proj], f"{prefix}.mlp.gate_proj")
        up = matmul(y, [mlp.up_proj], f"{prefix}.mlp.up_proj")
        if gelu:
            act = node("FastGelu", [gate], [f"/{prefix}/mlp/act/output_0"], f"/{prefix}/mlp/act", domain=MS)
        else:
            sigmoid = node("Sigmoid", [gate], [f"/{prefix}/mlp/Sigmoid/output_0"], f"/{prefix}/mlp/Sigmoid")
            act = node("Mul", [gate, sigmoid], [f"/{prefix}/mlp/act/output_0"], f"/{prefix}/mlp/act")
        product = node("Mul", [act, up], [f"/{prefix}/mlp/Mul/output_0"], f"/{prefix}/mlp/Mul")
        mlp_out = matmul(product, [mlp.down_proj], f"{prefix}.mlp.down_proj")
        if sandwich:
            mlp_out, _ = norm(f"{prefix}.post_feedforward_layernorm", layer.post_feedforward_layernorm, mlp_out)
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
