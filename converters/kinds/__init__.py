"""Model kinds: what differs between an encoder, a causal language model and a user's own module
lives in one adapter per kind (docs/architecture.md): the loader, the exported graph, the output the
distillation and the calibration probes use, the distillation loss and the validation agreement,
the plan's keywords for a model's linear layers, and (through eval.kinds) the quality metrics and
default texts. The plan's keywords, loading, checkpoints, calibration, the fine-tune loop and
export ask the adapter; methods and the budget never see the model's kind.

An adapter is an instance of a ModelKind subclass added to KINDS; the first that recognises a
model is its kind; a model directory's is the first that the folder names (a sentence-transformers folder: an
encoder), else the first that recognises its config.json."""

import json
from pathlib import Path

from torch import nn

from compressor.errors import CompressorError
from converters.kinds.base import ModelKind
from converters.kinds.causal_lm import CAUSAL_LM
from converters.kinds.encoder import ENCODER
from converters.kinds.own_lm import OWN_LM, OwnLM

__all__ = ["ModelKind", "OwnLM", "KINDS", "kind_of", "find_kind", "kind_for_config", "kind_named"]

KINDS: tuple[ModelKind, ...] = (CAUSAL_LM, OWN_LM, ENCODER)  # the encoder last: it takes any model with an embedding


def kind_named(name: str) -> ModelKind:
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise CompressorError(f"unknown model kind {name!r}; known: {', '.join(k.name for k in KINDS)}")


def find_kind(model: nn.Module) -> ModelKind | None:
    """The kind of `model`, None for a module no kind recognises (a user's own part of a model)."""
    return next((kind for kind in KINDS if kind.recognises(model)), None)


def kind_of(model: nn.Module) -> ModelKind:
    kind = find_kind(model)
    if kind is not None:
        return kind
    raise CompressorError(f"a {type(model).__name__} is no model kind the toolkit knows")


def kind_for_config(path: Path) -> ModelKind:
    """The kind of the model directory `path`: what the folder says (recognises_folder), else its config.json's."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise CompressorError(f"{Path(path) / 'config.json'} is not valid JSON: {e}") from None
    said = next((kind for kind in KINDS if kind.recognises_folder(Path(path), config)), None)
    kind = said or next((kind for kind in KINDS if kind.recognises_config(config)), None)
    if kind is not None:
        return kind
    what = config.get("model_type") or "no model_type"
    named = ", ".join(config.get("architectures") or ()) or "no architectures"
    raise CompressorError(
        f"{str(path)!r} holds a model ({what}, {named}) that no kind takes: the kinds are causal-lm (architectures "
        "ending in ForCausalLM or LMHeadModel, or a type transformers builds as a causal LM only) and encoder (a type "
        "transformers also builds as a masked LM: BERT, RoBERTa, XLM-R, MPNet, DeBERTa, ModernBERT, ELECTRA …, or a "
        "sentence-transformers folder whose model transformers builds as a bare model); encoder–decoder models are "
        "not taken"
    )
