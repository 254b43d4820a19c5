"""The interface of a model kind (see converters.kinds)."""

from abc import ABC, abstractmethod
from pathlib import Path

from torch import Tensor, nn

from eval.kinds import GraphKind
from files.onnx_files import WeightFile

__all__ = ["ModelKind"]


class ModelKind(ABC):
    """The interface every kind implements. `output(model, ids, mask)` is the tensor the kind's
    distillation, agreement and probes read (an encoder's last hidden state, an LM's logits)."""

    name: str
    graph: GraphKind  # how eval sees its exported graph
    agreement_name: str  # what `agreement` measures, as the fine-tune's messages name it
    finetune_batch: int  # passages per fine-tune step unless the user says otherwise
    options: tuple[str, ...] = ()  # command-line options (their dests) that only this kind takes
    baselines: tuple[str, ...] = ("int8",)  # the original's quantized rows in every report: what users do otherwise

    @abstractmethod
    def recognises(self, model: nn.Module) -> bool:
        """Whether a loaded module is of this kind."""

    @abstractmethod
    def recognises_config(self, config: dict) -> bool:
        """Whether a model directory whose config.json holds `config` is of this kind."""

    def recognises_folder(self, path: Path, config: dict) -> bool:
        """Whether the model directory `path` (its config.json: `config`) says itself that it is of this kind (a
        sentence-transformers folder: an encoder), before any kind is asked its config."""
        return False

    @abstractmethod
    def load(self, path: Path) -> nn.Module:
        """The trained model in a directory, in eval mode."""

    @abstractmethod
    def from_config(self, path: Path) -> nn.Module:
        """The model's structure from the config in `path`, untrained (a checkpoint loads into it)."""

    @abstractmethod
    def save_config(self, model: nn.Module, path: Path) -> None:
        """Write what from_config reads back into `path`."""

    @abstractmethod
    def export_graph(self, model: nn.Module) -> nn.Module:
        """A module whose forward takes the graph's inputs in order and returns its output."""

    def built_graph(self, model: nn.Module, opset: int, weights: WeightFile | None = None):
        """The graph written from the model's weights rather than traced (an onnx.ModelProto holding
        export_graph's contract; with `weights`, its weights written there as they are made), or None: traced."""
        return None

    def traced_because(self, model: nn.Module) -> str | None:
        """Why a model of a kind whose graph can be written from its weights is traced instead (in a few words),
        None when it is written or the kind writes none."""
        return None

    @abstractmethod
    def output(self, model: nn.Module, ids: Tensor, mask: Tensor) -> Tensor:
        """The model's output on a batch, the tensor distillation and probes read."""

    @abstractmethod
    def outputs(self, model: nn.Module, ids: Tensor, mask: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        """(output, every layer's hidden state (B, T, D), the embedding's output first): what the
        fine-tune's per-layer matching compares."""

    @abstractmethod
    def distill_loss(self, student: Tensor, teacher: Tensor, mask: Tensor, cfg) -> Tensor:
        """The scalar the fine-tune minimises, from the student's and teacher's outputs (cfg: its weights)."""

    @abstractmethod
    def agreement(self, student: Tensor, teacher: Tensor, mask: Tensor) -> Tensor:
        """One score per example, higher is closer (the fine-tune keeps the best weights by its mean)."""

    @abstractmethod
    def probes(self, output: Tensor, mask: Tensor, count: int, generator) -> list[Tensor]:
        """`count` random scalars whose expected gradient outer product is the loss Hessian at the output."""

    @abstractmethod
    def is_body_linear(self, name: str, module: nn.Module) -> bool:
        """A linear layer of the model's body (the "linear" target), not of a head on top."""

    def output_head(self, model: nn.Module) -> str | None:
        """The module name of the model's output projection (the "head" target), None if it has none."""
        return None

    def tie_(self, model: nn.Module) -> None:
        """In place: a model whose output head shares the input table computes its logits through
        whatever holds that table now (a dense table or a compact one's factors). Called after
        loading and after compression. The default: a kind without an output head has nothing to tie."""
        return None

    def mark_tied(self, model: nn.Module) -> None:
        """Record in the model's config that its head now shares the input table, so that a model
        rebuilt from that config is tied too (after the tying converter). The default: nothing to record."""
        return None

    def is_attention(self, name: str) -> bool:
        """A layer inside an attention block (the "attention" target; the rest of the body is "ffn")."""
        return ".attention." in f".{name}."
