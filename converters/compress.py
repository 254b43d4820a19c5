"""compress_(model, plan): check the whole plan against the model, build every compact module,
and only then swap them in, so a failure never leaves the model half-rewritten."""

import functools
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn
from tqdm.auto import tqdm

from compressor.errors import CompressorError, PlanError
from converters.calibration import Calibration
from converters.kinds import find_kind
from converters.plan import Plan, match_plan
from converters.registry import Context, Skip, handler_for
from converters.submodules import set_submodule
from converters.tying import check_tie, tie_

__all__ = ["CompressionReport", "compress_", "refuse_save_pretrained_"]


@dataclass
class CompressionReport:
    """What compress_ did to each module, and the warnings it raised (clamped ranks, …)."""

    modules: dict[str, dict] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # module name → why it stayed dense
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"modules": self.modules, "skipped": self.skipped, "notes": self.notes}


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _jobs(model: nn.Module, plan: Plan) -> list[tuple[str, object, object]]:
    """(module name, config, handler) for every module the plan's entries match."""
    return [
        (name, cfg, handler_for(name, model.get_submodule(name), cfg))
        for name, (_, cfg) in match_plan(plan, model).items()
    ]


def _refused(model_type: str, *args, **kwargs):
    raise CompressorError(
        f"this compressed {model_type} is no model transformers can load: it would rebuild the dense layers and fill "
        "them at random; save it with converters.save_compressed and load it with converters.load_model"
    )


def refuse_save_pretrained_(model: nn.Module) -> None:
    """In place: the model's `save_pretrained` (sentence-transformers' `save` calls it) raises one sentence
    naming save_compressed and load_model, instead of writing weights `from_pretrained` would load into
    the source's dense structure with a random table and only a warning."""
    if hasattr(model, "save_pretrained"):
        model.save_pretrained = functools.partial(_refused, type(model).__name__)


def compress_(
    model: nn.Module,
    plan: Plan,
    calibration: Calibration | None = None,
    progress: bool = True,
    on_estimate: Callable[[int, float], None] | None = None,
) -> CompressionReport:
    """Replace, in place, each module the plan matches by its compact form (a tied output head then
    computes through the compressed table); with `plan.tie`, tie the model first (checked with the
    rest of the plan). Methods that look at data (activation-aware, frequency-weighted, dense head)
    need `calibration`. `on_estimate(modules, seconds)`: after the first module, the whole build's time
    extrapolated from it."""
    if plan.tie is not None:
        check_tie(model, plan.tie)
    jobs = _jobs(model, plan)
    if calibration is None:
        needy = [name for name, cfg, handler in jobs if handler.needs_calibration(cfg)]
        if needy:
            raise PlanError(
                f"the plan needs calibration statistics for {len(needy)} module(s) ({needy[0]}, …); "
                "pass calibration text (--calib) or turn off whitening, weighting and the dense head"
            )
    report = CompressionReport()
    if plan.tie is not None:
        tie_(model, plan.tie)
        jobs = _jobs(model, plan)  # the same modules, the input table now tied
    built = {}
    start = time.perf_counter()
    for i, (name, cfg, handler) in enumerate(tqdm(jobs, desc="compress", disable=not progress or len(jobs) < 2)):
        if on_estimate is not None and i == 1:
            on_estimate(len(jobs), (time.perf_counter() - start) * len(jobs))
        dense = model.get_submodule(name)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compact = handler.build(dense, cfg, Context(name, calibration))
        for w in caught:
            report.notes.append(f"{name}: {w.message}")
            warnings.warn(f"{name}: {w.message}", stacklevel=2)
        if isinstance(compact, Skip):
            report.skipped[name] = compact.reason
            continue
        built[name] = compact
        report.modules[name] = {
            "method": cfg.method,
            "params_before": _count(dense),
            "params_after": _count(compact),
            "spec": compact.spec.to_dict(),
        }
    for name, compact in built.items():
        set_submodule(model, name, compact)
    if built:
        refuse_save_pretrained_(model)
    kind = find_kind(model)
    if kind is not None:
        kind.tie_(model)  # a tied head now computes through the compressed table
    return report
