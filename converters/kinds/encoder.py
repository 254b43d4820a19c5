"""The encoder kind (BERT-style): (input_ids, attention_mask) → last_hidden_state. A model type transformers also
builds as a masked LM, or any sentence-transformers folder (modules.json) whose Transformer transformers builds as a
bare model (AutoModel: Gemma 3 with bidirectional attention, EmbeddingGemma, among them). The graph is the folder's
Transformer: its Pooling, Dense and Normalize modules stay folder modules, copied beside the graph
(files.model_folder), as sentence-transformers' ONNX backend reads them, and the bench computes the embedding
through them (eval.kinds). Distilled on the mean-pooled output's cosine and the hidden states (the Transformer's
output, which the modules read); agreement is that cosine; the fisher probes are random directions of the pooled
output; quality is cosine and recall@10 of the folder's sentence embedding."""

import contextlib
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from converters.kinds.base import ModelKind
from converters.loading import load_hf
from eval.kinds import ENCODER as ENCODER_GRAPH
from eval.quality import mean_pool

__all__ = ["EncoderKind", "ENCODER", "EncoderGraph"]

HEADS = ("pooler", "lm_head", "cls")  # top-level modules that are heads, not the encoder's body


@contextlib.contextmanager
def broadcast_masks():
    """transformers builds an attention mask of its own pattern (a bidirectional Gemma 3's: every real key, or those
    within its window) through vmap, which the TorchScript tracer cannot follow; the pattern's functions are
    index-based, so while tracing they are applied by broadcasting (sdpa_mask's use_vmap=False). The export's parity
    check compares the graph with the model as transformers runs it."""
    from transformers import masking_utils

    vmapped = masking_utils.sdpa_mask

    def broadcast(*args, **kwargs):
        return vmapped(*args, **{**kwargs, "use_vmap": False})

    masking_utils.sdpa_mask = broadcast
    try:
        yield
    finally:
        masking_utils.sdpa_mask = vmapped


class EncoderGraph(nn.Module):
    """The graph's contract: (input_ids, attention_mask) → last_hidden_state (B, T, H)."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        with broadcast_masks() if torch.jit.is_tracing() else contextlib.nullcontext():
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class EncoderKind(ModelKind):
    name = "encoder"
    graph = ENCODER_GRAPH
    agreement_name = "validation cosine"
    finetune_batch = 32

    def recognises(self, model: nn.Module) -> bool:
        return hasattr(model, "get_input_embeddings")

    def recognises_config(self, config: dict) -> bool:
        """A text encoder: a model type transformers also builds as a masked LM (BERT, RoBERTa, XLM-R,
        MPNet, DeBERTa, ModernBERT, ELECTRA …), not an encoder–decoder (BART's type has a masked LM too)."""
        from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

        masked = config.get("model_type") in MODEL_FOR_MASKED_LM_MAPPING_NAMES
        return masked and not config.get("is_encoder_decoder", False)

    def recognises_folder(self, path: Path, config: dict) -> bool:
        """A sentence-transformers folder (modules.json) is an encoder whatever its architecture, where transformers
        builds its Transformer as a bare model (AutoModel, as sentence-transformers loads it), not an
        encoder–decoder."""
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

        bare = config.get("model_type") in MODEL_MAPPING_NAMES and not config.get("is_encoder_decoder", False)
        return bare and (Path(path) / "modules.json").is_file()

    def load(self, path: Path) -> nn.Module:
        from transformers import AutoModel

        return load_hf(AutoModel.from_pretrained, path)

    def from_config(self, path: Path) -> nn.Module:
        from transformers import AutoConfig, AutoModel

        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoModel.from_config(config, attn_implementation="eager")

    def save_config(self, model: nn.Module, path: Path) -> None:
        model.config.save_pretrained(path)

    def export_graph(self, model: nn.Module) -> nn.Module:
        return EncoderGraph(model)

    def output(self, model: nn.Module, ids: Tensor, mask: Tensor) -> Tensor:
        return model(input_ids=ids, attention_mask=mask).last_hidden_state

    def outputs(self, model: nn.Module, ids: Tensor, mask: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        return out.last_hidden_state, tuple(out.hidden_states)

    def distill_loss(self, student: Tensor, teacher: Tensor, mask: Tensor, cfg) -> Tensor:
        """w_cos · mean(1 − cos(pool_s, pool_t)) + w_hidden · ‖h_s − h_t‖² / ‖h_t‖² over real tokens."""
        student, teacher = student.float(), teacher.float()
        cos = self.agreement(student, teacher, mask)
        real = mask.bool()
        hidden = ((student - teacher)[real] ** 2).sum() / (teacher[real] ** 2).sum().clamp_min(1e-12)
        return cfg.cosine_weight * (1 - cos).mean() + cfg.hidden_weight * hidden

    def agreement(self, student: Tensor, teacher: Tensor, mask: Tensor) -> Tensor:
        """cos(pool(h_s), pool(h_t)) per passage."""
        return nn.functional.cosine_similarity(mean_pool(student, mask), mean_pool(teacher, mask), dim=-1)

    def probes(self, output: Tensor, mask: Tensor, count: int, generator: torch.Generator) -> list[Tensor]:
        """`count` scalars zᵀe over the batch, e the mean-pooled embedding, z = (I − êêᵀ) u / ‖e‖,
        u ~ N(0, I): E[z zᵀ] is the Hessian of 1 − cos(e, e') at e' = e."""
        e = mean_pool(output, mask)  # (B, H)
        norm = e.detach().norm(dim=-1, keepdim=True).clamp_min(1e-12)
        unit = e.detach() / norm
        out = []
        for _ in range(count):
            u = torch.randn(e.shape, generator=generator, dtype=e.dtype)
            out.append(((u - unit * (unit * u).sum(-1, keepdim=True)) / norm * e).sum())
        return out

    def is_body_linear(self, name: str, module: nn.Module) -> bool:
        return isinstance(module, nn.Linear) and not name.split(".")[0].startswith(HEADS)


ENCODER = EncoderKind()
