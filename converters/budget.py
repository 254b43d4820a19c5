"""A parameter budget over the targeted modules, turned into a concrete plan: each module's rank
is chosen by compressor.budget.allocate_ranks from the singular values its truncation uses (the
method's BudgetRule says which) so that the summed error is smallest. When the method's spectra
are loss estimates in common units (the fisher kind) they are summed as they are; otherwise each
layer's error is taken relative to its energy."""

import re
from dataclasses import replace

from torch import nn

from compressor.budget import allocate_ranks
from compressor.errors import PlanError
from converters.calibration import Calibration
from converters.plan import Plan, match_plan
from converters.registry import method_of

__all__ = ["parse_budget", "plan_for_budget"]

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


def plan_for_budget(model: nn.Module, targets: list[str], budget: str, calibration: Calibration, config) -> Plan:
    """A plan with one exact-name config per targeted module, derived from `config` by its method's
    budget rule, ranks chosen so that the targeted modules fit the budget."""
    unit, value = parse_budget(budget)
    method = method_of(config)
    rule = method.budget
    if rule is None:
        raise PlanError(f"the method {method.name} has no budget rule; name its ranks instead")
    names = list(match_plan(Plan(tuple((t, config) for t in targets)), model))
    modules = {n: model.get_submodule(n) for n in names}
    unsupported = [n for n, m in modules.items() if not isinstance(m, method.accepts)]
    if unsupported:
        kinds = " and ".join(t.__name__ for t in method.accepts)
        raise PlanError(f"a {method.name} budget applies to {kinds} layers; {unsupported[0]!r} is neither")
    configs = {n: rule.configure(m, config) for n, m in modules.items()}
    layers = [rule.cost(n, m, configs[n], calibration) for n, m in modules.items()]
    total = sum(layer.dense for layer in layers)
    params = int(value * total) if unit == "fraction" else int(value // 4)  # float32 weights
    relative = not rule.loss_units(config)
    alloc = allocate_ranks(layers, params, relative=relative)
    entries = []
    notes = [f"budget {budget}: {alloc.params:,} of {total:,} targeted weights ({alloc.params / total:.3f})"]
    for layer in layers:
        rank, err = alloc.ranks[layer.name], alloc.predicted_error[layer.name]
        if rank is None:
            notes.append(f"{layer.name}: kept dense (the greedy gave it every rank up to break-even)")
            continue
        entries.append((layer.name, replace(configs[layer.name], rank=rank)))
        what = "relative error" if relative else "loss increase"
        notes.append(f"{layer.name}: rank {rank}, predicted {what} {err:.4g}")
    if not entries:
        raise PlanError(f"the budget {budget} leaves every targeted module dense; nothing to compress")
    kind = getattr(config, "kind", None)
    name = "-".join(filter(None, [method.name, f"budget{budget}", kind]))
    return Plan(tuple(entries), name=name, notes=tuple(notes))
