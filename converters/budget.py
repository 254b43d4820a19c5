"""A parameter budget over the targeted modules, turned into a concrete plan: each module's size
(a rank, a number of Kronecker terms) is chosen by compressor.budget from the loss its method's
BudgetRule estimates at each size, so that the summed loss is smallest. When the losses are
estimates in common units (the fisher fit) they are summed as they are; otherwise each layer's
error is taken relative to its energy.

With one method each layer walks that method's sizes in order (allocate_ranks). With several
(`--method lowrank phm`), each layer is offered every size of every method that accepts it, and
the greedy walks the lower convex hull of those (parameters, loss) points (allocate): layer by
layer, the method and size with the best loss per parameter, under one budget. The methods must
estimate the same thing (the same fit: both rules then measure the same error of the same layer,
‖Lᵀ (W − W') S‖² for fisher, ‖(W − W') S‖² for aware, ‖W − W'‖² for plain, and relative errors
share the layer's energy as denominator); else the budget is refused."""

import math
import re
from collections.abc import Sequence

from torch import nn

from compressor.budget import Point, allocate, allocate_ranks
from compressor.errors import PlanError, RankError
from converters.calibration import Calibration
from converters.plan import Plan, match_plan
from converters.quantization.corrections.mixed import bytes_per_weight, quantization_error, widened
from converters.quantization.rounding.int4 import INT4_BLOCK
from converters.registry import Method, method_of

__all__ = ["parse_budget", "budget_layers", "check_budget_fits", "plan_for_budget"]

UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_budget(text: str) -> tuple[str, float]:
    """("fraction", f) for a number in (0, 1), or ("bytes", n) for sizes like 12MB or 40MiB."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if m is None:
        raise PlanError(f"a budget is a fraction in (0, 1) or a size such as 12MB, got {text!r}")
    value, unit = float(m.group(1)), m.group(2).lower()
    if not unit:
        if not 0 < value < 1:
            raise PlanError(f"a budget fraction must lie in (0, 1), got {text!r}")
        return "fraction", value
    if unit not in UNITS or value <= 0:
        raise PlanError(f"a budget size needs a positive number and a unit of {', '.join(UNITS)}; got {text!r}")
    return "bytes", value * UNITS[unit]


def _listed(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _methods(configs: Sequence) -> list[tuple[Method, object]]:
    """(method, config) of each config, checked: one config per method, each method with a budget
    rule, and all estimating the same thing."""
    pairs = [(method_of(cfg), cfg) for cfg in configs]
    if not pairs:
        raise PlanError("a budget needs at least one method config")
    names = [m.name for m, _ in pairs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise PlanError(f"a budget takes one config per method; {twice[0]} is given {names.count(twice[0])}")
    for method, _ in pairs:
        if method.budget is None:
            raise PlanError(f"the method {method.name} has no budget rule; name its ranks instead")
    metrics = {m.name: m.budget.metric(cfg) for m, cfg in pairs}
    if len(set(metrics.values())) > 1:
        said = ", ".join(f"{name} the {what} error" for name, what in metrics.items())
        raise PlanError(
            f"a budget over several methods compares their errors in one metric, but they estimate {said}; "
            "give them the same --fit"
        )
    return pairs


def budget_layers(model: nn.Module, targets: list[str], configs: Sequence) -> dict[str, list[tuple[Method, object]]]:
    """Module name → the (method, config) pairs of `configs` that can hold it, for every module the
    targets match; checked (the configs, every module held by some method, each method's own shape
    check) before anything is calibrated."""
    pairs = _methods(configs)
    names = list(match_plan(Plan(tuple((t, pairs[0][1]) for t in targets)), model))
    layers = {}
    for name in names:
        module = model.get_submodule(name)
        layers[name] = [(m, cfg) for m, cfg in pairs if isinstance(module, m.accepts)]
        if not layers[name]:
            kinds = list(dict.fromkeys(t.__name__ for m, _ in pairs for t in m.accepts))
            neither = "neither" if len(kinds) == 2 else "none of them"
            what = _listed([m.name for m, _ in pairs])
            raise PlanError(f"a {what} budget applies to {_listed(kinds)} layers; {name!r} is {neither}")
        for method, cfg in layers[name]:
            method.check(name, module, cfg)
    return layers


def _allowed(unit: str, value: float, total: int) -> int:
    """The parameters a budget allows without widths: a fraction of the `total` targeted, or a size
    in float32 weights."""
    return int(value * total) if unit == "fraction" else int(value // 4)


def check_budget_fits(
    model: nn.Module,
    targets: list[str],
    budget: str,
    configs: Sequence,
    widths: Sequence[str] = (),
    block: int = INT4_BLOCK,
) -> dict[str, list[tuple[Method, object]]]:
    """budget_layers, and the budget checked to hold every targeted module at its smallest size (each
    method's BudgetRule.bounds, from shapes alone; with `widths`, at the narrowest): a budget the
    greedy could never meet is refused before anything is calibrated."""
    unit, value = parse_budget(budget)
    if widths and unit != "bytes":
        raise PlanError(f"a budget over rank and bits is a size in bytes, such as 12MB; got {budget!r}")
    layers = budget_layers(model, targets, configs)
    least, total = {}, 0
    for name, held in layers.items():
        module = model.get_submodule(name)
        if any(method.budget.bounds is None for method, _ in held):
            return layers  # a rule that cannot tell: the greedy says it after calibrating
        bounds = [method.budget.bounds(module, method.budget.configure(module, cfg)) for method, cfg in held]
        least[name], total = min(low for low, _ in bounds), total + bounds[-1][1]
    if widths:
        narrowest = min(bytes_per_weight(w, block) for w in widths)
        least = {name: math.ceil(params * narrowest) for name, params in least.items()}  # as widened counts
    allowed, what = (int(value), "bytes") if widths else (_allowed(unit, value, total), "parameters")
    if least and sum(least.values()) > allowed:
        most = max(least, key=least.get)
        raise RankError(
            f"the budget {budget} ({allowed:,} {what}) is below the smallest allocation reachable "
            f"({sum(least.values()):,} {what}), every targeted module at its smallest size ({most} alone takes "
            f"{least[most]:,})"
        )
    return layers


def plan_for_budget(
    model: nn.Module,
    targets: list[str],
    budget: str,
    calibration: Calibration,
    configs,
    widths: Sequence[str] = (),
    block: int = INT4_BLOCK,
) -> Plan:
    """A plan with one exact-name config per targeted module, derived from `configs` (one config, or
    one per method the budget may choose among) by their methods' budget rules, sizes (and methods)
    chosen so that the targeted modules fit the budget; with `widths` (a byte budget), each module's
    width too (converters.quantization.corrections.mixed), in the plan's `widths`."""
    configs = list(configs) if isinstance(configs, list | tuple) else [configs]
    unit, value = parse_budget(budget)
    layers = check_budget_fits(model, targets, budget, configs, widths, block)
    (first, first_cfg), *_ = pairs = _methods(configs)
    methods = {m.name: m for m, _ in pairs}
    mixed = len(methods) > 1 or bool(widths)
    relative = first.budget.metric(first_cfg) != "loss"  # _methods checked that every method agrees
    made = {}  # (module name, method name) → the module's config under that method
    costs, points = [], {}
    for name, held in layers.items():
        module = model.get_submodule(name)
        points[name] = []
        for method, cfg in held:
            made[name, method.name] = method.budget.configure(module, cfg)
            costs.append(method.budget.cost(name, module, made[name, method.name], calibration))
            sized = [p for p in costs[-1].points(relative) if p.size is not None]
            points[name] += [Point(p.size, p.params, p.loss, method.name) for p in sized]
        points[name].append(Point(None, costs[-1].dense, 0.0))
        if widths:
            errors = {w: quantization_error(module, w, block) for w in widths}
            points[name] = widened(points[name], costs[-1].nothing_kept(relative), errors, block)
    if widths:
        total = sum(max(p.params for p in layer) for layer in points.values())  # every layer dense in fp32
        alloc = allocate(points, int(value), unit="bytes")
        notes = [f"budget {budget}: {alloc.params:,} of {total:,} bytes of the targeted weights in fp32"]
    else:
        total = sum(p[-1].params for p in points.values())
        params = _allowed(unit, value, total)
        alloc = allocate(points, params) if mixed else allocate_ranks(costs, params, relative=relative)
        notes = [f"budget {budget}: {alloc.params:,} of {total:,} targeted weights ({alloc.params / total:.3f})"]
    what = "relative error" if relative else "loss increase"
    entries, taken, chosen_widths = [], [], []
    for name in layers:
        point, err = alloc.points[name], alloc.predicted_error[name]
        tag, _, width = point.tag.partition("|")
        at = f" at {width}" if width else ""
        if width:
            chosen_widths.append((name, width))
        method = methods.get(tag) or next(iter(methods.values()))  # a dense point has no method
        if point.size is None:
            why = "the dense layer as its best move" if mixed else f"every {method.budget.size} up to break-even"
            notes.append(f"{name}: kept dense{at} (the greedy gave it {why}), predicted {what} {err:.4g}")
            continue
        taken.append(method.name)
        entries.append((name, method.budget.resize(made[name, method.name], point.size)))
        which = f"{method.name}, " if len(methods) > 1 else ""
        notes.append(f"{name}: {which}{method.budget.size} {point.size}{at}, predicted {what} {err:.4g}")
    if not entries and not widths:
        raise PlanError(f"the budget {budget} leaves every targeted module dense; nothing to compress")
    if len(methods) > 1:
        counts = ", ".join(f"{name} {taken.count(name)}" for name in methods)
        notes.insert(1, f"layers by method: {counts}, dense {len(layers) - len(taken)}")
    if widths:
        counts = ", ".join(f"{w} {[w_ for _, w_ in chosen_widths].count(w)}" for w in widths)
        notes.insert(1, f"layers by width: {counts}")
    fit = getattr(configs[0], "fit", None)
    label = "-".join(filter(None, ["+".join(methods), f"budget{budget}", "mixed" if widths else "", fit]))
    return Plan(tuple(entries), name=label, notes=tuple(notes), widths=tuple(chosen_widths))
