"""A parameter budget over the targeted modules, turned into a concrete low-rank plan: each
module's rank is chosen by compressor.budget.allocate_ranks from the singular values its
truncation uses (whitened for linear layers, frequency-weighted for the embedding's tail) so
that the summed error is smallest. The fisher kind also maps each layer's output by its
sensitivity: its σ² are then loss estimates in common units, summed as they are; the other
kinds' errors are relative to each layer's energy."""

import re
from dataclasses import replace

import torch
from torch import nn

from compressor.budget import LayerCost, allocate_ranks
from compressor.errors import PlanError
from compressor.lowrank import SENSITIVITY_DAMP, cholesky_whitener
from converters.calibration import Calibration
from converters.methods import head_tokens
from converters.plan import LowRankConfig, Plan, match_plan

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


def _output_root(calib: Calibration, name: str, cfg: LowRankConfig) -> torch.Tensor | None:
    return cholesky_whitener(calib.sensitivity(name), SENSITIVITY_DAMP)[0] if cfg.sensitive else None


def _layer_cost(name: str, module: nn.Module, calib: Calibration, cfg: LowRankConfig) -> LayerCost:
    """The layer's cost per rank and the singular values its truncation under `cfg` will use."""
    w = module.weight.detach().to(torch.float64)
    out = _output_root(calib, name, cfg)
    if isinstance(module, nn.Linear):
        if cfg.whiten:
            w = w @ cholesky_whitener(calib.gram(name))[0]
        if out is not None:
            w = out.T @ w
        k, d = module.weight.shape
        return LayerCost(name, torch.linalg.svdvals(w), per_rank=k + d, dense=k * d)
    rows, dim = w.shape
    tail = torch.ones(rows, dtype=torch.bool)
    if cfg.dense_head:
        tail[head_tokens(calib, cfg.dense_head)] = False
    weighted = w[tail]
    if cfg.weighted:
        weighted = weighted * (calib.counts[tail].to(torch.float64) + 1.0).sqrt()[:, None]
    spectrum = torch.linalg.svdvals(weighted if out is None else weighted @ out)
    return LayerCost(name, spectrum, per_rank=int(tail.sum()) + dim, dense=rows * dim, fixed=cfg.dense_head * dim)


def plan_for_budget(
    model: nn.Module,
    targets: list[str],
    budget: str,
    calibration: Calibration,
    dense_head: int = 0,
    kind: str = "fisher",
) -> Plan:
    """A plan with one exact-name LowRankConfig of `kind` per targeted module, ranks from the budget."""
    unit, value = parse_budget(budget)
    probe = Plan(tuple((t, LowRankConfig(dense_head=dense_head)) for t in targets))
    names = list(match_plan(probe, model))
    modules = {n: model.get_submodule(n) for n in names}
    unsupported = [n for n, m in modules.items() if not isinstance(m, nn.Linear | nn.Embedding)]
    if unsupported:
        raise PlanError(f"a budget applies to linear and embedding layers; {unsupported[0]!r} is neither")
    configs = {
        n: LowRankConfig.of_kind(kind, rank=1, keep=None, dense_head=dense_head if isinstance(m, nn.Embedding) else 0)
        for n, m in modules.items()
    }
    layers = [_layer_cost(n, m, calibration, configs[n]) for n, m in modules.items()]
    total = sum(layer.dense for layer in layers)
    params = int(value * total) if unit == "fraction" else int(value // 4)  # float32 weights
    relative = not configs[names[0]].sensitive
    alloc = allocate_ranks(layers, params, relative=relative)
    entries, notes = (
        [],
        [f"budget {budget}: {alloc.params:,} of {total:,} targeted weights ({alloc.params / total:.3f})"],
    )
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
    return Plan(tuple(entries), name=f"lowrank-budget{budget}-{kind}", notes=tuple(notes))
