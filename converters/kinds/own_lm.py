"""A user's own language model, a plain nn.Module the toolkit has never seen (an LSTM LM, say): the
user wraps it in `OwnLM`, naming its input table and its output projection, and everything that
takes a causal LM takes it — plans by module name, tying, compression, the KL fine-tune, ONNX
export and the LM quality metrics. Its forward must map input_ids (B, T) (and optionally
attention_mask) to logits (B, T, V), or to a tuple whose first item they are. It has no config file
the toolkit could rebuild it from: the user saves and loads it with their own code."""

import inspect
from pathlib import Path

from torch import Tensor, nn

from compressor.errors import CompressorError
from converters.distributed import Shards
from converters.kinds.causal_lm import CausalLMKind
from converters.submodules import set_submodule

__all__ = ["OwnLM", "OWN_LM", "OwnLMKind"]


class OwnLM(nn.Module):
    """`module` with its parts named: `embedding` (the input table) and `head` (the output projection,
    None if it has none), module names inside `module`. forward(input_ids, attention_mask) → logits."""

    def __init__(self, module: nn.Module, embedding: str, head: str | None = None):
        super().__init__()
        names = {n for n, _ in module.named_modules()}
        for what, name in (("embedding", embedding), ("head", head)):
            if name is not None and name not in names:
                raise CompressorError(f"the {what} {name!r} is no module of the {type(module).__name__}")
        self.module = module
        self.embedding_name, self.head_name = embedding, head
        self.takes_mask = len(inspect.signature(module.forward).parameters) > 1  # (input_ids, attention_mask, …)

    def get_input_embeddings(self) -> nn.Module:
        return self.module.get_submodule(self.embedding_name)

    def get_output_embeddings(self) -> nn.Module | None:
        return None if self.head_name is None else self.module.get_submodule(self.head_name)

    def set_output_embeddings(self, head: nn.Module) -> None:
        set_submodule(self.module, self.head_name, head)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        takes = self.takes_mask and attention_mask is not None
        out = self.module(input_ids, attention_mask) if takes else self.module(input_ids)
        return out[0] if isinstance(out, tuple) else out  # (B, T, V)


class OwnGraph(nn.Module):
    """The graph's contract, as a causal LM's: (input_ids, attention_mask) → logits (B, T, V), 0 at
    padding (so that the mask is an input even of a model that does not read it: an LSTM)."""

    def __init__(self, model: OwnLM):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        logits = self.model(input_ids, attention_mask)
        return logits * attention_mask.unsqueeze(-1).to(logits.dtype)


class OwnLMKind(CausalLMKind):
    """A causal LM in all but loading: the distillation, agreement, probes, tying and quality are
    the causal LM's; the per-layer matching sees the input table's output only."""

    name = "own-lm"

    def recognises(self, model: nn.Module) -> bool:
        return isinstance(model, OwnLM)

    def recognises_config(self, config: dict) -> bool:
        return False

    def _by_own_code(self, path: Path):
        raise CompressorError(
            f"{str(path)!r}: a model of your own is loaded and saved by your own code; wrap it in OwnLM to "
            "compress, tie, fine-tune and export it"
        )

    load = from_config = _by_own_code

    def save_config(self, model: nn.Module, path: Path) -> None:
        self._by_own_code(path)

    def export_graph(self, model: nn.Module) -> nn.Module:
        return OwnGraph(model)

    def output(self, model: nn.Module, ids: Tensor, mask: Tensor) -> Tensor:
        return model(ids, mask)

    def outputs(self, model: nn.Module, ids: Tensor, mask: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        wrapped = isinstance(model, (nn.parallel.DistributedDataParallel, Shards))
        inner = model.module if wrapped else model  # under torchrun, the model DistributedDataParallel or FSDP holds
        return model(ids, mask), (inner.get_input_embeddings()(ids),)

    def output_head(self, model: nn.Module) -> str | None:
        return None if model.head_name is None else f"module.{model.head_name}"

    def is_body_linear(self, name: str, module: nn.Module) -> bool:
        return isinstance(module, nn.Linear)  # the plan leaves the output head out of every body target

    def mark_tied(self, model: nn.Module) -> None:
        return None  # no config to record it in: the user's module is tied in memory


OWN_LM = OwnLMKind()
