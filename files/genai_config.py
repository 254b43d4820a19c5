"""ONNX Runtime GenAI's `genai_config.json` beside a fused decoder's graph, so that its generator (its
C++ loop, `og.Model(folder)`) runs our graph as it runs its own model builder's. The fused graph
(converters.kinds.fused_decoder) is in that layout already: inputs input_ids, attention_mask and
past_key_values.{i}.key/value, outputs logits and present.{i}.key/value, GroupQueryAttention writing
each step's keys into the past's buffer in place (`past_present_share_buffer`). The numbers come from
the folder's config.json; greedy search by default, as the builder writes it. A traced graph (GPT-2,
compressed layers) is left without one: its attention does not share the buffer."""

import json
from pathlib import Path

import onnx

from files.atomic import atomic_file
from files.onnx_files import load_onnx

__all__ = ["GENAI_CONFIG", "is_fused_decoder", "genai_config", "write_genai_config"]

GENAI_CONFIG = "genai_config.json"
_PAST, _PRESENT = "past_key_values.%d.", "present.%d."


def is_fused_decoder(graph: onnx.ModelProto) -> bool:
    """Whether `graph` is a fused decoder's: GroupQueryAttention, its pasts named as GenAI reads them."""
    inputs = {i.name for i in graph.graph.input}
    fused = any(n.op_type == "GroupQueryAttention" for n in graph.graph.node)
    return fused and {"input_ids", "attention_mask", _PAST % 0 + "key"} <= inputs and "position_ids" not in inputs


def _first(value):
    return value[0] if isinstance(value, list) else value


def genai_config(config: dict, graph: str) -> dict:
    """GenAI's configuration of the decoder `graph` (its path relative to the folder) of the model
    whose config.json holds `config`."""
    heads = config["num_attention_heads"]
    eos = config.get("eos_token_id")
    context = config.get("max_position_embeddings", 2048)
    return {
        "model": {
            "bos_token_id": config.get("bos_token_id"),
            "context_length": context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": graph,
                "head_size": config.get("head_dim") or config["hidden_size"] // heads,
                "hidden_size": config["hidden_size"],
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": _PAST + "key",
                    "past_value_names": _PAST + "value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": _PRESENT + "key",
                    "present_value_names": _PRESENT + "value",
                },
                "num_attention_heads": heads,
                "num_hidden_layers": config["num_hidden_layers"],
                "num_key_value_heads": config.get("num_key_value_heads") or heads,
            },
            "eos_token_id": eos,
            "pad_token_id": config.get("pad_token_id") if config.get("pad_token_id") is not None else _first(eos),
            "type": config.get("model_type", "llama"),
            "vocab_size": config["vocab_size"],
        },
        "search": {
            "do_sample": False,
            "max_length": context,
            "num_beams": 1,
            "past_present_share_buffer": True,
            "temperature": 1.0,
            "top_k": 50,
            "top_p": 1.0,
        },
    }


def write_genai_config(folder: Path, graph: Path) -> bool:
    """Write `folder`/genai_config.json for `graph` (a file under `folder`) when it is a fused decoder's
    and the folder has a config.json; whether it was written. Only a causal LM's graph is read (an
    encoder's folder is written without loading its graph again)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        return False
    config = json.loads((folder / "config.json").read_text())
    causal = any(a.endswith("ForCausalLM") for a in config.get("architectures") or ())
    if not causal or not is_fused_decoder(load_onnx(graph, weights=False)):
        return False
    with atomic_file(folder / GENAI_CONFIG) as tmp:
        tmp.write_text(json.dumps(genai_config(config, Path(graph).relative_to(folder).as_posix()), indent=4))
    return True
