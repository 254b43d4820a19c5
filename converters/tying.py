"""Tying a trained model's output projection to its input table (Press & Wolf): one V × D matrix
serves both ends, initialised from the input table (by default: on the LMs of BENCHMARKS.md it
kept more than the output projection, which the paper finds the tied table resembles), the output
projection, or their mean; for an encoder–decoder with one vocabulary, three ways (the
encoder's input too). Then the tied head's score: plain, or one of Liu et al.'s normalised variants
(compressor.tying). A switch of either changes the model: the converter (`compressor tie`) follows
it with a distillation fine-tune from the untied original."""

from dataclasses import asdict, dataclass

import torch
from torch import nn

from compressor.errors import CompressorError
from compressor.tied_logits import TiedLogits
from compressor.tying import SCORES
from converters.kinds import kind_of

__all__ = ["INITS", "TieConfig", "check_tie", "tie_", "set_score_", "tie_encoder_decoder_"]

INITS = ("output", "input", "mean")  # what the shared table starts from


@dataclass(frozen=True)
class TieConfig:
    """init: output | input | mean, or None to leave the model's tying as it is and set the score only;
    score: dot | l2 | square | distance | cosine, the tied head's (compressor.tying)."""

    init: str | None = "input"
    score: str = "dot"

    def __post_init__(self):
        if self.init is not None and self.init not in INITS:
            raise CompressorError(f"unknown tying init {self.init!r}; known: {', '.join(INITS)}")
        if self.score not in SCORES:
            raise CompressorError(f"unknown tied score {self.score!r}; known: {', '.join(SCORES)}")

    def label(self) -> str:
        return "-".join(["tied", *([self.init] if self.init else []), *([self.score] if self.score != "dot" else [])])

    def to_dict(self) -> dict:
        return asdict(self)


def _parts(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(input table, output head) of a model that has an output head, else one sentence saying it has none."""
    kind = kind_of(model)
    if kind.output_head(model) is None:
        raise CompressorError(f"this {kind.name} model has no output projection to tie to its input table")
    return model.get_input_embeddings(), model.get_output_embeddings()


def _check_same_shape(shapes: dict[str, tuple[int, ...]]) -> None:
    if len(set(shapes.values())) > 1:
        said = ", ".join(f"{what} {' × '.join(map(str, shape))}" for what, shape in shapes.items())
        raise CompressorError(
            f"tying needs one shape at both ends, and the {said} differ (a projection between them, as in ALBERT, "
            "is not built)"
        )


def check_tie(model: nn.Module, cfg: TieConfig) -> None:
    """One sentence for a model `cfg` cannot tie, before anything changes."""
    table, head = _parts(model)
    if isinstance(head, TiedLogits):
        return  # tied already: only the score changes
    if cfg.init is None:
        raise CompressorError(
            f"the score {cfg.score!r} is an option of a tied head, and this model's output projection is not tied "
            "to its input table: tie it (init output, input or mean)"
        )
    if not isinstance(table, nn.Embedding) or not isinstance(head, nn.Linear):
        raise CompressorError(
            f"tying takes a dense input table and output projection, not a {type(table).__name__} and a "
            f"{type(head).__name__}: tie first, then compress the tied table"
        )
    _check_same_shape({"input table": tuple(table.weight.shape), "output projection": tuple(head.weight.shape)})


def tie_(model: nn.Module, cfg: TieConfig) -> str:
    """In place: the model's head becomes TiedLogits over its input table (started from cfg.init) with
    cfg.score; a model tied already only gets the score. Returns what was done, in a sentence."""
    check_tie(model, cfg)
    table, head = _parts(model)
    if isinstance(head, TiedLogits):
        set_score_(model, cfg.score)
        return f"the head was tied already; its score is now {cfg.score}"
    with torch.no_grad():
        first = {"output": [head.weight], "input": [table.weight], "mean": [table.weight, head.weight]}[cfg.init]
        table.weight = nn.Parameter(torch.stack([t.detach() for t in first]).mean(0).clone())
    model.set_output_embeddings(TiedLogits(table, cfg.score, head.bias))
    kind_of(model).mark_tied(model)
    return f"tied the output projection to the input table, started from the {cfg.init} table, score {cfg.score}"


def set_score_(model: nn.Module, score: str) -> None:
    """In place: the tied head scores with `score`; one sentence if the head is not tied."""
    table, head = _parts(model)
    if not isinstance(head, TiedLogits):
        raise CompressorError(
            f"the score {score!r} is an option of a tied head, and this model's output projection is not tied to its "
            "input table: tie it first"
        )
    head.release()
    model.set_output_embeddings(TiedLogits(table, score, head.bias))


def tie_encoder_decoder_(model: nn.Module, init: str = "input") -> None:
    """In place, three-way tying of a Hugging Face encoder–decoder: the encoder's input table, the
    decoder's input table and the output projection become one matrix (started from `init`: the
    output projection, the decoder's input table, or the mean of the three)."""
    if init not in INITS:
        raise CompressorError(f"unknown tying init {init!r}; known: {', '.join(INITS)}")
    head = model.get_output_embeddings()
    if not getattr(model.config, "is_encoder_decoder", False) or head is None:
        raise CompressorError(
            f"three-way tying needs an encoder–decoder with an output projection; a {type(model).__name__} is not one"
        )
    ends = {
        "encoder's input table": model.get_encoder().get_input_embeddings(),
        "decoder's input table": model.get_decoder().get_input_embeddings(),
        "output projection": head,
    }
    shapes = {what: tuple(m.weight.shape) for what, m in ends.items()}
    if len({s[0] for s in shapes.values()}) > 1:
        rows = ", ".join(f"{what} {s[0]:,}" for what, s in shapes.items())
        raise CompressorError(
            f"three-way tying needs one vocabulary for source and target, and the tokens differ: {rows}"
        )
    _check_same_shape(shapes)
    distinct = list({id(m.weight): m.weight for m in ends.values()}.values())
    first = {"output": [head.weight], "input": [ends["decoder's input table"].weight], "mean": distinct}[init]
    shared = nn.Parameter(torch.stack([t.detach() for t in first]).mean(0).clone())
    old = {id(t) for t in distinct}
    for module in model.modules():  # every alias of the three (a `shared` table, say) takes the one matrix
        if isinstance(getattr(module, "weight", None), nn.Parameter) and id(module.weight) in old:
            module.weight = shared
    config = model.config
    config.tie_word_embeddings = True
    if hasattr(config, "share_encoder_decoder_embeddings"):
        config.share_encoder_decoder_embeddings = True
