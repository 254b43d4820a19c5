"""A plan is data: an ordered map from a module target to a method config, saved as JSON.

A target is an exact module name ("embeddings.word_embeddings"), a dotted suffix of one
("word_embeddings"), a full-match regular expression ("re:encoder\\.layer\\.\\d+\\..*"), or a
keyword: "embeddings" (the input word embedding), "attention" (linear layers inside attention
blocks), "ffn" (the other linear layers of the body), "linear" (both), "all" (everything above),
"head" (a language model's output projection, when it is not tied to the input embedding). The
first entry that matches a module wins.

A plan may also tie the model first ("tie": {"init": "input", "score": "dot"}, converters.tying):
the entries then compress the tied table, which serves both ends.
"""

import difflib
import json
import re
from dataclasses import asdict, dataclass, fields

from torch import nn

from compressor.errors import PlanError
from compressor.tied_logits import TiedLogits
from converters.kinds import kind_of
from converters.methods.fit import legacy_fit
from converters.registry import method_named, methods
from converters.tying import TieConfig

__all__ = ["Plan", "PLAN_VERSION", "WIDTHS", "TARGET_KEYWORDS", "match_plan", "input_embedding_name"]

PLAN_VERSION = 1
WIDTHS = ("fp32", "int8", "int4")  # what a mixed budget may give a module (converters.quantization.corrections.mixed)


@dataclass(frozen=True)
class Plan:
    entries: tuple[tuple[str, object], ...]  # (target, a registered method's config)
    name: str | None = None  # a short label for reports; default: the entries' labels joined
    notes: tuple[str, ...] = ()  # how the plan was made (a budget's chosen ranks and predicted errors, …)
    widths: tuple[tuple[str, str], ...] = ()  # (module, fp32|int8|int4): a mixed budget's width per module
    tie: TieConfig | None = None  # tie the output head to the input table before the entries

    def label(self) -> str:
        labels = ([self.tie.label()] if self.tie else []) + [cfg.label() for _, cfg in self.entries]
        return self.name or "+".join(dict.fromkeys(labels))

    def to_dict(self) -> dict:
        return {
            "version": PLAN_VERSION,
            "name": self.name,
            "notes": list(self.notes),
            **({"widths": dict(self.widths)} if self.widths else {}),
            **({"tie": self.tie.to_dict()} if self.tie else {}),
            "entries": [
                {"target": target, "method": cfg.method, "config": asdict(cfg)} for target, cfg in self.entries
            ],
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Plan":
        if not isinstance(data, dict) or data.get("version") != PLAN_VERSION:
            raise PlanError(f'a plan must be a JSON object with "version": {PLAN_VERSION}')
        entries = []
        for i, entry in enumerate(data.get("entries") or []):
            method = entry.get("method") if isinstance(entry, dict) else None
            if method not in methods():
                raise PlanError(f"plan entry {i}: unknown method {method!r}; known: {', '.join(methods())}")
            config_type = method_named(method).config
            known = {f.name for f in fields(config_type)}
            config = entry.get("config") or {}
            if not isinstance(config, dict):
                raise PlanError(f"plan entry {i}: its config is an object of {method} options, got {config!r}")
            if "fit" in known:
                config = legacy_fit(config)  # a plan written before the fit was one field
            unknown = set(config) - known
            if unknown:
                raise PlanError(f"plan entry {i}: {method} has no option(s) {sorted(unknown)}; known: {sorted(known)}")
            entries.append((str(entry.get("target", "")), config_type(**config)))
        widths = data.get("widths") or {}
        if not isinstance(widths, dict) or not all(v in WIDTHS for v in widths.values()):
            raise PlanError('a plan\'s "widths" maps module names to fp32, int8 or int4')
        tie = data.get("tie")
        if tie is not None:
            if not isinstance(tie, dict) or set(tie) - {"init", "score"}:
                raise PlanError('a plan\'s "tie" is an object with "init" (output, input, mean or null) and "score"')
            tie = TieConfig(**tie)
        if not entries and not widths and tie is None:
            raise PlanError("a plan must have at least one entry")
        notes = tuple(data.get("notes") or ())
        return cls(tuple(entries), data.get("name"), notes, tuple(widths.items()), tie)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"a plan file must be JSON: {e}") from None
        return cls.from_dict(data)


def input_embedding_name(model: nn.Module) -> str:
    """The module name of the model's input word embedding."""
    get = getattr(model, "get_input_embeddings", None)
    target = get() if get else None
    for name, module in model.named_modules():
        if module is target:
            return name
    raise PlanError('the target "embeddings" needs a model with get_input_embeddings(); name the module instead')


TARGET_KEYWORDS = ("embeddings", "attention", "ffn", "linear", "all", "head")


def _output_head(model: nn.Module) -> str:
    """The name of the model's untied output projection (the "head" target), else a PlanError saying why not."""
    kind = kind_of(model)
    name = kind.output_head(model)
    if name is None:
        raise PlanError(f'the target "head" needs an output projection, and a {kind.name} model has none')
    if isinstance(model.get_submodule(name), TiedLogits):
        raise PlanError(
            f'the output head {name!r} is tied to the input embedding: compress "embeddings" and the head computes '
            "its logits through the same factors"
        )
    return name


def _matches(target: str, name: str, model: nn.Module) -> bool:
    if target.startswith("re:"):
        return re.fullmatch(target[3:], name) is not None
    if target == "head":
        return name == _output_head(model)
    if target not in TARGET_KEYWORDS:
        return name == target or name.endswith("." + target)
    if target in ("embeddings", "all") and name == input_embedding_name(model):
        return True
    kind = kind_of(model)
    if target == "embeddings" or not kind.is_body_linear(name, model.get_submodule(name)):
        return False
    if name == kind.output_head(model):
        return False  # the output projection is the "head" target's, never the body's
    return target in ("linear", "all") or (target == "attention") == kind.is_attention(name)


def match_plan(plan: Plan, model: nn.Module) -> dict[str, tuple[str, object]]:
    """Module name → (target, config) for every module some entry matches; every entry must
    match at least one module, else PlanError naming the closest module names."""
    names = [n for n, _ in model.named_modules() if n]
    chosen: dict[str, tuple[str, object]] = {}
    for target, cfg in plan.entries:
        if target.startswith("re:"):
            try:
                re.compile(target[3:])
            except re.error as e:
                raise PlanError(f"target {target!r} is not a valid regular expression: {e}") from None
        hits = [n for n in names if _matches(target, n, model)]
        if not hits:
            close = difflib.get_close_matches(target.removeprefix("re:"), names, n=5, cutoff=0.4)
            hint = f"closest names: {', '.join(close)}" if close else f"it has e.g. {', '.join(names[:5])}"
            raise PlanError(f"the plan names {target!r} but the model has no such module; {hint}")
        for n in hits:
            chosen.setdefault(n, (target, cfg))
    return chosen
