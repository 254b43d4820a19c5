"""The method registry: every compression method registers once, in its own file under
converters/methods/, and the CLI's options, the plan's JSON, the checkpoint's module table and the
budget read it. Nothing else names a method.

A method is a config dataclass (frozen, a ClassVar `method` naming it), a `build` that turns one
trained module into its compact form (or a Skip saying why it stays dense), the compact module
classes a checkpoint may rebuild, its command-line options (converters/options.py: declared on the
config's fields), and optionally a budget rule and the forms its modules may be exported in."""

import importlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from torch import nn

from compressor.budget import LayerCost, MeasuredCost
from compressor.errors import CompressorError, PlanError
from converters.calibration import Calibration
from converters.options import Option, config_from_options, field_options, given, option_field, register_once

__all__ = [
    "BudgetRule",
    "Context",
    "Method",
    "Option",
    "Skip",
    "register",
    "methods",
    "method_named",
    "method_of",
    "default_method",
    "handler_for",
    "compact_modules",
    "given",
    "option_field",
    "field_options",
    "config_from_options",
    "ExportForms",
    "export_forms",
]


@dataclass(frozen=True)
class Skip:
    """A module the method leaves dense, and why."""

    reason: str


@dataclass(frozen=True)
class Context:
    """What a build sees besides the module and its config: the module's name and the calibration."""

    name: str
    calibration: Calibration | None

    def require_calibration(self, what: str) -> Calibration:
        if self.calibration is None:
            raise PlanError(f"{self.name}: {what} needs calibration statistics; pass calibration text (--calib)")
        return self.calibration


@dataclass(frozen=True)
class BudgetRule:
    """How a budget sizes a method's layers: `configure(module, cfg)` is the config one module gets,
    `resize(cfg, size)` that config at a size (default: its rank), and `cost(name, module, cfg,
    calibration)` the module's parameters and estimated loss at each size (a LayerCost from a
    spectrum, or a MeasuredCost). `metric(cfg)` names what the losses measure (by the config's fit:
    methods.fit.FIT_METRICS): "weight" (the weight's error), "output" (the output error on the
    calibration inputs; frequency-weighted rows for a table) or "loss" (the K-FAC loss estimate, the
    one unit common to every layer; the others are made relative per layer). Methods share a budget
    only when their losses measure the same thing. `size` names the size in notes; `sets`: the
    method's options the budget chooses (refused beside --budget). `bounds(module, cfg)`, optional:
    (the fewest parameters the module can be held in under the configured `cfg`, its dense
    parameters), from shapes alone, so that a budget too small is refused before calibrating."""

    cost: Callable[[str, nn.Module, Any, Calibration], LayerCost | MeasuredCost]
    configure: Callable[[nn.Module, Any], Any]
    metric: Callable[[Any], str]
    bounds: Callable[[nn.Module, Any], tuple[int, int]] | None = None
    resize: Callable[[Any, int], Any] = lambda cfg, size: replace(cfg, rank=size)
    size: str = "rank"
    sets: tuple[str, ...] = ("rank",)


@dataclass(frozen=True)
class ExportForms:
    """The forms besides itself in which a method's compact modules may be exported (a DeFINE unit:
    computed, cached as a table, or cached for the frequent tokens and computed for the rest), asked
    by export and run before a graph is traced. `option` picks the form (its choices; the first, the
    default, is each module as it is); `options`: what else the forms read. `holds(module)`: a module
    the forms apply to (the outermost one is taken); `prepare(module, form, values, frequencies)`: the
    module to export in its place, `values` the options by dest, `frequencies()` the calibration text's
    token counts (a Calibration) for a form that needs them; `check(form, values, module, cfg)`: before
    any work, on a trained module the plan's `cfg` will compress; `what`: such a module, in words."""

    option: Option
    holds: Callable[[nn.Module], bool]
    prepare: Callable[[nn.Module, str, dict[str, Any], Callable[[], Calibration]], nn.Module]
    what: str
    check: Callable[[str, dict[str, Any], nn.Module, Any], None] = lambda form, values, module, cfg: None
    options: tuple[Option, ...] = ()

    @property
    def default(self) -> str:
        return self.option.choices[0]


@dataclass(frozen=True)
class Method:
    """One compression method. `from_options(values)` builds a config from the method's option
    values (a dict from option dest to the value given, or None when not given)."""

    config: type
    accepts: tuple[type[nn.Module], ...]
    build: Callable[[nn.Module, Any, Context], nn.Module | Skip]
    compact: tuple[type[nn.Module], ...]
    from_options: Callable[[dict[str, Any]], Any]
    options: tuple[Option, ...] = ()
    check: Callable[[str, nn.Module, Any], None] = lambda name, module, cfg: None  # raises on a module cfg cannot fit
    needs_calibration: Callable[[Any], bool] = lambda cfg: False
    needs_sensitivity: Callable[[Any], bool] = lambda cfg: False
    budget: BudgetRule | None = None
    export_forms: ExportForms | None = None
    default: bool = False  # the method the command line uses when none is named

    @property
    def name(self) -> str:
        return self.config.method


_METHODS: dict[str, Method] = {}
_builtins_loaded = False


def register(method: Method) -> Method:
    """Add `method` to the registry; a second method under the same name is refused."""
    return register_once(_METHODS, method.name, method, lambda m: m.config, "method")


def methods() -> dict[str, Method]:
    """Every registered method by name; the built-in ones (converters/methods/*) are imported first."""
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        importlib.import_module("converters.methods")
    return dict(_METHODS)


def method_named(name: str) -> Method:
    known = methods()
    if name not in known:
        raise PlanError(f"unknown method {name!r}; known: {', '.join(known)}")
    return known[name]


def method_of(config: object) -> Method:
    """The method whose config `config` is."""
    for method in methods().values():
        if type(config) is method.config:
            return method
    raise PlanError(f"no method is registered for {type(config).__name__}")


def default_method() -> Method:
    for method in methods().values():
        if method.default:
            return method
    raise CompressorError("no registered method is marked default=True")


def handler_for(name: str, module: nn.Module, config: object) -> Method:
    """The method of `config`, checked to accept `module` (else an "unsupported module" PlanError) and
    by the method's own `check` (shapes the config needs), before anything is calibrated or built."""
    method = method_of(config)
    if not isinstance(module, method.accepts):
        kinds = ", ".join(t.__name__ for t in method.accepts)
        raise PlanError(
            f"unsupported module: {method.name} applies to {kinds}, but {name!r} is a {type(module).__name__}"
        )
    method.check(name, module, config)
    return method


def export_forms() -> dict[str, ExportForms]:
    """The export forms of every method that has them, by method name."""
    return {name: m.export_forms for name, m in methods().items() if m.export_forms is not None}


def compact_modules() -> dict[str, type[nn.Module]]:
    """Compact module classes a checkpoint may rebuild, by class name (the loading allowlist)."""
    return {cls.__name__: cls for method in methods().values() for cls in method.compact}
