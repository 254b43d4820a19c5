"""A plan is data: an ordered map from a module target to a method config, saved as JSON.

A target is an exact module name ("embeddings.word_embeddings"), a dotted suffix of one
("word_embeddings"), a full-match regular expression ("re:encoder\\.layer\\.\\d+\\..*"), or a
keyword: "embeddings" (the input word embedding), "attention" (linear layers inside attention
blocks), "ffn" (the other linear layers of the encoder), "linear" (both), "all" (everything
above). The first entry that matches a module wins.
"""

import difflib
import json
import re
from dataclasses import asdict, dataclass, fields
from typing import ClassVar

from torch import nn

from compressor.errors import PlanError
from compressor.ranks import check_rank, check_rel_eps
from compressor.token_order import TOKEN_ORDERS

__all__ = [
    "TTConfig",
    "LowRankConfig",
    "Plan",
    "METHODS",
    "PLAN_VERSION",
    "TARGET_KEYWORDS",
    "match_plan",
    "input_embedding_name",
]

PLAN_VERSION = 1


@dataclass(frozen=True)
class TTConfig:
    """Tensor-train embedding: TT-SVD truncated at `rank` and/or relative error `rel_eps`; with
    `weighted`, cores refitted to the calibration token frequencies (needs calibration), and with
    `sensitive` also under the embedding output's sensitivity (the "fisher" kind)."""

    method: ClassVar[str] = "tt"
    rank: int | None = 32
    rel_eps: float | None = None
    num_cores: int = 2
    order: str = "pca"
    dense_head: int = 0  # keep the rows of this many most frequent tokens exact (needs calibration)
    weighted: bool = False
    sensitive: bool = False

    @property
    def kind(self) -> str:
        return "fisher" if self.sensitive else "aware" if self.weighted else "plain"

    def __post_init__(self):
        _check_dense_head(self.dense_head)
        if self.sensitive and not self.weighted:
            raise PlanError("output sensitivity (fisher) builds on frequency-weighted TT cores")
        if self.weighted and self.num_cores != 2:
            raise PlanError(f"frequency-weighted TT cores are fitted for 2 cores, got num_cores={self.num_cores}")
        if self.rank is None and self.rel_eps is None:
            raise PlanError("a TT plan needs a rank, a relative error, or both; got neither")
        if self.rank is not None:
            check_rank(self.rank)
        if self.rel_eps is not None:
            check_rel_eps(self.rel_eps)
        if isinstance(self.num_cores, bool) or not isinstance(self.num_cores, int) or not 2 <= self.num_cores <= 6:
            raise PlanError(f"the number of TT cores must be an integer from 2 to 6, got {self.num_cores!r}")
        if self.order not in TOKEN_ORDERS:
            raise PlanError(f"token order must be one of {', '.join(TOKEN_ORDERS)}, got {self.order!r}")

    def label(self) -> str:
        parts = [f"r{self.rank}" if self.rank is not None else "", f"e{self.rel_eps}" if self.rel_eps else ""]
        head = [f"head{self.dense_head}"] if self.dense_head else []
        kind = [self.kind] if self.weighted else []
        return "-".join(["tt", *head, *filter(None, parts), self.order, *kind])


def _check_dense_head(k: object) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise PlanError(f"a dense head must be a number of rows ≥ 0, got {k!r}")


LOWRANK_KINDS = ("plain", "aware", "fisher")


@dataclass(frozen=True)
class LowRankConfig:
    """Low-rank factors W ≈ up · down at `rank`, or at the rank that keeps the fraction `keep` of
    the module's parameters. Linear layers: activation-aware when `whiten` (needs calibration).
    Embeddings: rows weighted by token frequency when `weighted`, and an exact `dense_head`.
    `sensitive` adds each layer's output sensitivity to either (the "fisher" kind)."""

    method: ClassVar[str] = "lowrank"
    rank: int | None = None
    keep: float | None = 0.5
    whiten: bool = True
    weighted: bool = True
    dense_head: int = 0
    sensitive: bool = False

    @classmethod
    def of_kind(cls, kind: str, **options) -> "LowRankConfig":
        """plain: SVD; aware: activation-aware / frequency-weighted; fisher: aware + output sensitivity."""
        if kind not in LOWRANK_KINDS:
            raise PlanError(f"a low-rank kind is one of {', '.join(LOWRANK_KINDS)}, got {kind!r}")
        aware = kind != "plain"
        return cls(whiten=aware, weighted=aware, sensitive=kind == "fisher", **options)

    @property
    def kind(self) -> str:
        return "fisher" if self.sensitive else "aware" if self.whiten else "plain"

    def __post_init__(self):
        _check_dense_head(self.dense_head)
        if self.sensitive and not (self.whiten and self.weighted):
            raise PlanError("output sensitivity (fisher) builds on activation-aware and frequency-weighted factors")
        if self.rank is None and self.keep is None:
            raise PlanError("a low-rank plan needs a rank or a fraction of parameters to keep; got neither")
        if self.rank is not None:
            check_rank(self.rank)
        if self.keep is not None and (isinstance(self.keep, bool) or not 0 < self.keep < 1):
            raise PlanError(f"the fraction of parameters to keep must lie in (0, 1), got {self.keep!r}")

    def label(self) -> str:
        size = f"r{self.rank}" if self.rank is not None else f"keep{self.keep:g}"
        head = [f"head{self.dense_head}"] if self.dense_head else []
        return "-".join(["lowrank", *head, size, self.kind])


METHODS: dict[str, type] = {
    "tt": TTConfig,
    "lowrank": LowRankConfig,
}  # the allowlist a plan file is rebuilt from

MethodConfig = TTConfig | LowRankConfig


@dataclass(frozen=True)
class Plan:
    entries: tuple[tuple[str, MethodConfig], ...]
    name: str | None = None  # a short label for reports; default: the entries' labels joined
    notes: tuple[str, ...] = ()  # how the plan was made (a budget's chosen ranks and predicted errors, …)

    def label(self) -> str:
        return self.name or "+".join(dict.fromkeys(cfg.label() for _, cfg in self.entries))

    def to_dict(self) -> dict:
        return {
            "version": PLAN_VERSION,
            "name": self.name,
            "notes": list(self.notes),
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
            if method not in METHODS:
                raise PlanError(f"plan entry {i}: unknown method {method!r}; known: {', '.join(METHODS)}")
            config_type = METHODS[method]
            known = {f.name for f in fields(config_type)}
            config = entry.get("config") or {}
            unknown = set(config) - known
            if unknown:
                raise PlanError(f"plan entry {i}: {method} has no option(s) {sorted(unknown)}; known: {sorted(known)}")
            entries.append((str(entry.get("target", "")), config_type(**config)))
        if not entries:
            raise PlanError("a plan must have at least one entry")
        return cls(tuple(entries), data.get("name"), tuple(data.get("notes") or ()))

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


def _is_encoder_linear(name: str, module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) and not name.split(".")[0].startswith(("pooler", "lm_head", "cls"))


TARGET_KEYWORDS = {
    "attention": lambda n, m: _is_encoder_linear(n, m) and ".attention." in f".{n}.",
    "ffn": lambda n, m: _is_encoder_linear(n, m) and ".attention." not in f".{n}.",
    "linear": _is_encoder_linear,
}


def _matches(target: str, name: str, model: nn.Module) -> bool:
    if target == "embeddings":
        return name == input_embedding_name(model)
    if target == "all":
        return name == input_embedding_name(model) or _is_encoder_linear(name, model.get_submodule(name))
    if target in TARGET_KEYWORDS:
        return TARGET_KEYWORDS[target](name, model.get_submodule(name))
    if target.startswith("re:"):
        return re.fullmatch(target[3:], name) is not None
    return name == target or name.endswith("." + target)


def match_plan(plan: Plan, model: nn.Module) -> dict[str, tuple[str, MethodConfig]]:
    """Module name → (target, config) for every module some entry matches; every entry must
    match at least one module, else PlanError naming the closest module names."""
    names = [n for n, _ in model.named_modules() if n]
    chosen: dict[str, tuple[str, MethodConfig]] = {}
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
