"""Sweep recipes: a JSON file of variants, each a method with its options, an optional fine-tune
and the quantization schemes to measure it in, parsed and checked here and run elsewhere.

    {"variants": [{"name": "tt-64", "method": "tt", "rank": 64, "fit": "fisher",
                   "finetune_time": 300, "quantize": ["fp32", "int8"]}, ...]}

A recipe's option keys are the options of `compressor run` that make one variant, spelled as
their flags (--rank: rank, --dense-head: dense_head, --finetune-steps: finetune_steps), each value
what one would type after the flag; the texts, the cache and the bench are the sweep's own
options. Every error is one sentence, raised before anything runs."""

import argparse
import copy
import difflib
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compressor.errors import CompressorError
from converters.cli.builtin_recipes import DEFAULT_RECIPES
from converters.cli.options import actions_of, finetune_options, method_options, quantize_option
from converters.cli.specs import variant_spec
from converters.kinds import ModelKind
from converters.pipeline.checks import check_method_options
from converters.quantization.registry import schemes
from converters.registry import methods
from converters.spec import QUANTIZE_ONLY, TextSpec, VariantSpec

__all__ = [
    "quantize_choices",
    "Recipe",
    "parse_recipes",
    "load_recipes",
    "default_run",
]

SWEEP_WIDE = ("calib", "calib_passages", "no_cache", "data")  # options of the sweep, not of a variant
PRIOR_DESTS = ("freq_prior", "prior_weight")  # a recipe may set them; alone they do not replace the default recipe


def _keys(action: argparse.Action) -> list[str]:
    """The recipe keys of an option: its flag's, then its older spellings'."""
    return [f[2:].replace("-", "_") for f in action.option_strings if f.startswith("--")]


@functools.cache
def _variant_options() -> dict[str, argparse.Action]:
    """Recipe key → the action of `compressor run` it sets: the method and fine-tune options, one
    value each (--targets: a list), less --method, --plan (a recipe is the plan) and the options of
    the whole sweep."""
    actions = actions_of(
        functools.partial(method_options, many=False),
        functools.partial(finetune_options, run=True),
        functools.partial(quantize_option, help="", recipe=True),
    )
    left_out = ("method", "plan", "quantize", *SWEEP_WIDE)  # a recipe's "quantize" is its own key
    return {key: a for a in actions if _keys(a)[0] not in left_out for key in _keys(a)}


@functools.cache
def _quantize_keys() -> frozenset[str]:
    """The recipe keys of the quantization settings (block_size, table_bits, …): all a recipe of no method takes."""
    actions = actions_of(functools.partial(quantize_option, help="", recipe=True))
    return frozenset(key for a in actions for key in _keys(a) if key != "quantize")


@dataclass(frozen=True)
class Recipe:
    """One variant of a sweep. `options`: option dest → value, as `compressor run` would parse
    them; `quantize`: the schemes to measure it in (quantize_choices)."""

    method: str | list[str]  # several: a budget chooses among them, layer by layer
    options: dict[str, Any] = field(default_factory=dict)
    quantize: tuple[str, ...] = ("fp32",)
    name: str | None = None

    def values(self) -> dict[str, Any]:
        """`compressor run`'s parsed options for this variant: this recipe's, every other variant option not given
        (None: the configs' defaults); --quantize the recipe's schemes other than fp32."""
        values = dict.fromkeys(a.dest for a in _variant_options().values())
        values.update(copy.deepcopy(self.options), method=self.method)  # shares no list with the recipe
        values["quantize"] = [s for s in self.quantize if s != "fp32"] or None
        return values

    def variant(self, said: str | None = None) -> VariantSpec:
        """The variant this recipe makes, named after it; its fp32 graph measured if "fp32" is asked."""
        return variant_spec(self.values(), self.name, "fp32" in self.quantize, said)

    def to_dict(self) -> dict:
        """The recipe as a variant of a recipe file."""
        keys = {a.dest: _keys(a)[0] for a in _variant_options().values()}
        named = {} if self.name is None else {"name": self.name}
        return {
            **named,
            "method": self.method,
            **{keys[d]: v for d, v in self.options.items()},
            "quantize": [*self.quantize],
        }


def _closest(word: object, choices) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f"the closest is {close[0]!r}" if close else f"valid: {', '.join(choices)}"


def _value(action: argparse.Action, key: str, value: object, where: str):
    """`value` as argparse parses it after the flag; a list for an option that takes several."""
    several = action.nargs == "+"
    what = {int: "an integer", float: "a number"}.get(action.type, "text")
    items = value if several and isinstance(value, list) and value else [value]
    parsed = []
    for item in items:
        try:
            if isinstance(item, bool) or not isinstance(item, str | int | float):
                raise TypeError
            one = (action.type or str)(str(item))
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            raise CompressorError(
                f"{where}: {key!r} takes {'a list of ' if several else ''}{what}, got {json.dumps(value)}"
            ) from None
        if action.choices is not None and one not in action.choices:
            raise CompressorError(f"{where}: {key!r} is one of {', '.join(map(str, action.choices))}, got {item!r}")
        parsed.append(one)
    return parsed if several else parsed[0]


def quantize_choices() -> tuple[str, ...]:
    """What a recipe's "quantize" lists: fp32 (the graph as exported) and the registered schemes."""
    return ("fp32", *schemes())


def _quantize(value: object, where: str) -> tuple[str, ...]:
    choices = quantize_choices()
    if not isinstance(value, list) or not value:
        raise CompressorError(f"{where}: 'quantize' is a list of schemes from {', '.join(choices)}")
    for scheme in value:
        if scheme not in choices:
            raise CompressorError(f"{where}: unknown quantization scheme {scheme!r}; {_closest(scheme, choices)}")
    return tuple(dict.fromkeys(value))


def _recipe(entry: object, where: str) -> Recipe:
    """One variant of a recipe file, checked against the method registry and run's options."""
    if not isinstance(entry, dict):
        raise CompressorError(f"{where} is not an object of a method and its options")
    name = entry.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise CompressorError(f"{where}: a variant's name is non-empty text, got {json.dumps(name)}")
    where += f" ({name!r})" if name else ""
    known = methods()
    method = entry.get("method")
    if method is None:
        raise CompressorError(
            f'{where} names no method; give "method": one of {", ".join(known)}, or {QUANTIZE_ONLY!r} (the original)'
        )
    if method == QUANTIZE_ONLY:
        return _quantized_original(entry, where)
    names = method if isinstance(method, list) else [method]  # several: a budget chooses among them
    if not names or not all(isinstance(m, str) for m in names):
        raise CompressorError(f'{where}: "method" is a method name or a list of them, got {json.dumps(method)}')
    for m in names:
        if m not in known:
            raise CompressorError(f"{where}: unknown method {m!r}; {_closest(m, known)}")
    own = {o.dest for m in names for o in known[m].options}
    owners = {o.dest: n for n, m in known.items() for o in m.options if o.dest not in own}
    actions = {k: a for k, a in _variant_options().items() if k not in owners}
    options = {}
    for key, value in entry.items():
        if key in ("name", "method", "quantize"):
            continue
        if key in owners:
            raise CompressorError(f"{where}: {key!r} is an option of method {owners[key]}, not of {' or '.join(names)}")
        if key in SWEEP_WIDE:
            raise CompressorError(
                f"{where}: {key!r} is for the whole sweep, not one variant; give it on the command line"
            )
        if key not in actions:
            raise CompressorError(f"{where}: unknown option {key!r}; {_closest(key, [*actions, 'name', 'quantize'])}")
        options[actions[key].dest] = _value(actions[key], key, value, where)
    return Recipe(method, options, _quantize(entry.get("quantize", ["fp32"]), where), name)


def _quantized_original(entry: dict, where: str) -> Recipe:
    """A recipe of method QUANTIZE_ONLY: the original in its schemes, with quantization settings only."""
    actions = _variant_options()
    options = {}
    for key, value in entry.items():
        if key in ("name", "method", "quantize"):
            continue
        if key not in _quantize_keys():
            raise CompressorError(
                f"{where}: {key!r} is not a quantization setting; method {QUANTIZE_ONLY!r} quantizes the original "
                f"and takes {', '.join(sorted(_quantize_keys()))}"
            )
        options[actions[key].dest] = _value(actions[key], key, value, where)
    schemes = tuple(s for s in _quantize(entry.get("quantize"), where) if s != "fp32")
    if not schemes:
        raise CompressorError(f"{where}: method {QUANTIZE_ONLY!r} needs a scheme in 'quantize' beside fp32")
    return Recipe(QUANTIZE_ONLY, options, schemes, entry.get("name"))


def _check(recipe: Recipe, where: str) -> None:
    """The options make a plan (or a budget) and a fine-tune as `compressor run` would, without
    touching the disk (the cache folder is the sweep's to check)."""
    try:
        variant = recipe.variant()  # the quantization settings checked
        if variant.method is not None:
            check_method_options(variant.method, TextSpec(no_cache=True))
    except CompressorError as e:
        raise type(e)(f"{where}: {e}") from None


def parse_recipes(data: object, source: str) -> list[Recipe]:
    """The recipes of a recipe file's content; `source` names it in errors."""
    if not isinstance(data, dict) or not isinstance(data.get("variants"), list):
        raise CompressorError(f'{source} is not a recipe file: a JSON object with a "variants" list')
    if not data["variants"]:
        raise CompressorError(f"{source} has no variants")
    recipes = []
    for i, entry in enumerate(data["variants"]):
        where = f"{source}, variants[{i}]"
        recipes.append(_recipe(entry, where))
        _check(recipes[-1], where)
    names = [r.name for r in recipes if r.name is not None]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise CompressorError(f"{source} names two variants {twice[0]!r}; give each its own name")
    return recipes


def load_recipes(path: str | Path | None = None) -> list[Recipe]:
    """The recipes of the JSON file at `path`; DEFAULT_RECIPES without one."""
    if path is None:
        return parse_recipes(DEFAULT_RECIPES, "the built-in recipes")
    path = Path(path)
    if not path.is_file():
        raise CompressorError(f"recipe file {str(path)!r} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CompressorError(
            f'{str(path)!r} is not JSON ({e}); a recipe file is an object with a "variants" list'
        ) from None
    return parse_recipes(data, repr(str(path)))


@functools.cache
def _method_dests() -> frozenset[str]:
    """The dests of `compressor run`'s method options (--method, its options, --targets, --budget, --plan)."""
    actions = actions_of(functools.partial(method_options, many=False))
    return frozenset(a.dest for a in actions) - {*SWEEP_WIDE, *PRIOR_DESTS}


# The options that say which machine the graphs are for, not how a recipe rounds: every row takes them, the
# comparison rows in default settings too
MACHINE_DESTS = ("target_cpu",)


def default_run(
    values: dict[str, Any], kind: ModelKind, run: dict, source: str, strict: bool = False
) -> list[VariantSpec] | None:
    """The variants of `run` (a recipe file's content: a goal's, converters/cli/goals.py, or a recipe's) when
    `compressor run`'s parsed options `values` give no method option (an option not given is None), the options they
    give overriding its named recipes' own (MACHINE_DESTS: every row's); with --quantize given, the original in its
    schemes and the settings given alone; for a model `kind` whose graph the run's schemes do not take (w4a8 and the
    narrow tables are an encoder's), none: the run is the original's own rows (`strict`: refused, the scheme's reason
    said); None when they give a method option."""
    if any(values.get(d) is not None for d in _method_dests()):
        return None
    given = {k: v for k, v in values.items() if v is not None and v is not False}
    if "quantize" in given:
        return [variant_spec({**values, "method": QUANTIZE_ONLY})]
    recipes = parse_recipes(run, source)
    try:
        for recipe in recipes:
            for config in recipe.variant().quantize.schemes:
                config.check(kind.graph)
    except CompressorError as e:
        if strict:
            raise CompressorError(f"{source} is not for this model: {e}") from None
        return []
    variants = []
    for recipe in recipes:
        overrides = given if recipe.name is not None else {d: given[d] for d in MACHINE_DESTS if d in given}
        merged = {**values, **recipe.values(), **overrides}
        variants.append(variant_spec(merged, recipe.name))
    return variants
