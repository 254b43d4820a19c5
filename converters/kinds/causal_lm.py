"""The causal language model kind (Llama-, GPT-2-style): (input_ids, attention_mask) → logits; its
graph carries a key-value cache (CausalLMGraph).
Distilled on KL(teacher ‖ student) of the next-token distributions at a temperature; agreement is
−KL per passage; the fisher probes are log p(y | x) with y drawn from the model's own distribution,
whose gradient covariance is the Fisher of the output; quality is perplexity, top-1 agreement and
KL (eval.kinds). A model whose output head shares the input table gets a TiedLogits head, which
computes the logits through whatever holds the table: stored once, never formed."""

import inspect
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from compressor.dense import LINEAR_TYPES
from compressor.tied_logits import TiedLogits
from converters.kinds.base import ModelKind
from converters.kinds.fused_decoder import fused_decoder, unfused_reason
from converters.loading import load_hf
from eval.kinds import CAUSAL_LM as CAUSAL_LM_GRAPH
from eval.probe import PAST, PRESENT
from files.onnx_files import WeightFile

__all__ = ["CausalLMKind", "CAUSAL_LM", "CausalLMGraph"]

ARCHITECTURE_ENDS = ("ForCausalLM", "LMHeadModel")  # config.json architectures of causal LMs


class CausalLMGraph(nn.Module):
    """The graph's contract, Optimum's for a decoder with a key-value cache: (input_ids (B, T),
    attention_mask (B, past + T), position_ids (B, T), past_key_values.{i}.key / .value (B, heads, past,
    head_dim)) → (logits (B, T, V), present.{i}.key / .value (B, heads, past + T, head_dim)). With the
    pasts empty it reads a prompt; each generated token is then one more step, fed the presents."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        config = model.config
        self.layers = config.num_hidden_layers
        self.heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # transformers ≥ 5.2x takes the cache as `cache` (past_key_values deprecated); before, as past_key_values
        # (an unknown `cache` would be swallowed by **kwargs and the pasts ignored)
        takes = inspect.signature(model.forward).parameters
        self.cache_name = "cache" if "cache" in takes else "past_key_values"

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, *past: Tensor):
        from transformers.cache_utils import DynamicCache

        pairs = [(past[2 * i], past[2 * i + 1]) for i in range(self.layers)]
        # every layer's cache whole, a sliding window's too (its mask keeps the window): made from the config, a
        # windowed layer's keeps its last window − 1 positions, and a graph traced so breaks at the window
        cache = DynamicCache(pairs)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **{self.cache_name: cache},
        )  # the cache grows in place: the presents are read from it, whatever the output names it
        return (out.logits, *(t for layer in cache.layers for t in (layer.keys, layer.values)))

    def input_names(self) -> list[str]:
        kv = [f"{i}.{k}" for i in range(self.layers) for k in ("key", "value")]
        return ["input_ids", "attention_mask", "position_ids", *(PAST + n for n in kv)]

    def signature(self, ids: Tensor, mask: Tensor):
        """(trace inputs, input names, output names, dynamic axes): `ids` read after a random past of 3."""
        past = 3
        batch = ids.shape[0]
        full = torch.cat([torch.ones(batch, past, dtype=mask.dtype), mask], dim=1)
        positions = (full.cumsum(1) - 1).clamp_min(0)[:, past:]
        g = torch.Generator().manual_seed(0)
        pasts = [torch.randn(batch, self.heads, past, self.head_dim, generator=g) for _ in range(2 * self.layers)]
        kv = [f"{i}.{k}" for i in range(self.layers) for k in ("key", "value")]
        names = self.input_names()
        outputs = ["logits", *(PRESENT + n for n in kv)]
        axes = {n: {0: "batch", 1: "sequence"} for n in ("input_ids", "position_ids", "logits")}
        axes["attention_mask"] = {0: "batch", 1: "past_sequence + sequence"}
        axes.update({PAST + n: {0: "batch", 2: "past_sequence"} for n in kv})
        axes.update({PRESENT + n: {0: "batch", 2: "past_sequence + sequence"} for n in kv})
        return (ids, full, positions, *pasts), names, outputs, axes


def _real(mask: Tensor) -> Tensor:
    return mask.bool()


# Positions whose distributions over the vocabulary the distillation's KL makes at once: over Qwen2.5's 151,936
# tokens each (batch, sequence, V) tensor of a training batch (8 × 64) is 311 MB, and the KL made whole held six
KL_ROWS = 64


def _kl_rows(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """KL(softmax(t/τ) ‖ softmax(s/τ)) of each row, (n, V) → (n,)."""
    s = torch.log_softmax(student.float() / temperature, dim=-1)
    t = torch.log_softmax(teacher.float() / temperature, dim=-1)
    return (t.exp() * (t - s)).sum(-1)


class CausalLMKind(ModelKind):
    name = "causal-lm"
    graph = CAUSAL_LM_GRAPH
    agreement_name = "validation −KL"
    finetune_batch = 8  # a 135M-parameter LM: forward + backward of 8 × 64 tokens is ~4 s on 2 cores
    options = ("temperature",)
    # A CPU LM's users run 4-bit weights (llama.cpp, ONNX Runtime GenAI): plain and int4-aware (on SmolLM2
    # perplexity 39.5 against int4's 43.0 at 0.206× the file against 0.193×; through the fused decoder's graph it
    # adds under 4 minutes on 2 cores; BENCHMARKS.md, "The fused decoder"). int4-corrected: `--quantize`. int8 is the
    # one line a user would write; w8 the 8-bit row that keeps the answers (top-1 agreement 0.957 / 0.949 on SmolLM2
    # against int8's 0.526 / 0.477, 0.966 / 0.961 on Gemma-3-270M; docs/schemes/w8.md).
    baselines = ("int8", "w8", "int4", "int4-aware")

    def recognises(self, model: nn.Module) -> bool:
        return type(model).__name__.endswith(ARCHITECTURE_ENDS)

    def recognises_config(self, config: dict) -> bool:
        """By `architectures`; without it, by a `model_type` that transformers builds as a causal LM and
        not as a masked LM (Llama, Qwen2, GPT-2 … but not BERT, whose type has both)."""
        architectures = config.get("architectures") or ()
        if architectures:
            return any(str(a).endswith(ARCHITECTURE_ENDS) for a in architectures)
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
            MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        )

        model_type = config.get("model_type")
        return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES

    def load(self, path: Path) -> nn.Module:
        from transformers import AutoModelForCausalLM

        model = load_hf(AutoModelForCausalLM.from_pretrained, path)
        self.tie_(model)
        return model

    def from_config(self, path: Path) -> nn.Module:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        self.tie_(model)
        return model

    def save_config(self, model: nn.Module, path: Path) -> None:
        model.config.save_pretrained(path)

    def export_graph(self, model: nn.Module) -> nn.Module:
        return CausalLMGraph(model)

    def built_graph(self, model: nn.Module, opset: int, weights: WeightFile | None = None):
        """A Llama-style decoder of plain layers in ONNX Runtime's fused operators (kinds.fused_decoder)."""
        return fused_decoder(model, opset, weights)

    def traced_because(self, model: nn.Module) -> str | None:
        return unfused_reason(model)

    def output(self, model: nn.Module, ids: Tensor, mask: Tensor) -> Tensor:
        return model(input_ids=ids, attention_mask=mask, use_cache=False).logits

    def outputs(self, model: nn.Module, ids: Tensor, mask: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        out = model(input_ids=ids, attention_mask=mask, use_cache=False, output_hidden_states=True)
        return out.logits, tuple(out.hidden_states)

    def _kl(self, student: Tensor, teacher: Tensor, mask: Tensor, temperature: float = 1.0) -> Tensor:
        """KL(softmax(t/τ) ‖ softmax(s/τ)) per real position, (B, T) (0 at padding), KL_ROWS positions at a time,
        each chunk's intermediates made again in the backward (torch.utils.checkpoint) rather than kept."""
        width = student.shape[-1]
        rows, targets = student.reshape(-1, width), teacher.reshape(-1, width)
        training = torch.is_grad_enabled() and student.requires_grad
        parts = [
            checkpoint(_kl_rows, rows[at : at + KL_ROWS], targets[at : at + KL_ROWS], temperature, use_reentrant=False)
            if training
            else _kl_rows(rows[at : at + KL_ROWS], targets[at : at + KL_ROWS], temperature)
            for at in range(0, len(rows), KL_ROWS)
        ]
        return torch.cat(parts).view(student.shape[:-1]) * _real(mask)

    def distill_loss(self, student: Tensor, teacher: Tensor, mask: Tensor, cfg) -> Tensor:
        """τ² · mean over real positions of KL(p_t^τ ‖ p_s^τ), τ = cfg.temperature (Hinton et al.)."""
        tau = cfg.temperature
        return tau * tau * self._kl(student, teacher, mask, tau).sum() / _real(mask).sum().clamp_min(1)

    def agreement(self, student: Tensor, teacher: Tensor, mask: Tensor) -> Tensor:
        """−mean KL(p_t ‖ p_s) over each passage's real positions."""
        return -self._kl(student, teacher, mask).sum(1) / _real(mask).sum(1).clamp_min(1)

    def probes(self, output: Tensor, mask: Tensor, count: int, generator: torch.Generator) -> list[Tensor]:
        """`count` scalars Σ_positions log p(y | x), y ~ p(· | x) drawn afresh each time: E[g gᵀ] of their
        gradients at the logits is the Fisher of the output, the Hessian of KL(p ‖ p') at p' = p."""
        logp = torch.log_softmax(output.float(), dim=-1)  # (B, T, V)
        probs = logp.detach().exp().reshape(-1, logp.shape[-1])
        real = _real(mask)
        out = []
        for _ in range(count):
            y = torch.multinomial(probs, 1, generator=generator).view(logp.shape[:-1])  # (B, T)
            out.append((logp.gather(-1, y[..., None]).squeeze(-1) * real).sum())
        return out

    def output_head(self, model: nn.Module) -> str | None:
        head = model.get_output_embeddings()
        return next((n for n, m in model.named_modules() if m is head), None)

    def tie_(self, model: nn.Module) -> None:
        """A head that shares the input table (an nn.Linear holding the embedding's own weight, or a
        TiedLogits, whose score and bias it keeps) becomes TiedLogits over the input embedding as it is now."""
        head, table = model.get_output_embeddings(), model.get_input_embeddings()
        if isinstance(head, TiedLogits):
            head.release()
            model.set_output_embeddings(TiedLogits(table, head.score, head.bias))
        elif isinstance(head, nn.Linear) and isinstance(table, nn.Embedding) and head.weight is table.weight:
            model.set_output_embeddings(TiedLogits(table, bias=head.bias))

    def mark_tied(self, model: nn.Module) -> None:
        model.config.tie_word_embeddings = True

    def is_body_linear(self, name: str, module: nn.Module) -> bool:
        return isinstance(module, LINEAR_TYPES) and name.split(".")[0] not in ("lm_head", "score")

    def is_attention(self, name: str) -> bool:
        return any(f".{part}." in f".{name}." for part in ("self_attn", "attn", "attention"))


CAUSAL_LM = CausalLMKind()
