"""The plans a method spec asks for (converters.spec.MethodSpec): its plan file's, or one per combination of the
values given to its methods' options, each option refused where another method owns it; made once per spec. A
budget's plans need the model and calibration (steps.plans_and_calibration)."""

import functools
import itertools

from compressor.errors import CompressorError
from converters.plan import Plan
from converters.registry import method_named, methods
from converters.spec import MethodSpec

__all__ = ["config_sets", "plans_of"]


def config_sets(spec: MethodSpec, default_fit: str | None = None) -> list[tuple]:
    """One config per method of the spec, for each combination of the values given to their options
    (in their order); a flag the methods share gives each of them the same value. `default_fit`: the
    fit where none was given (else each method's own default)."""
    chosen = [method_named(name) for name in spec.methods]
    own = {o.dest for m in chosen for o in m.options}
    for name, other in methods().items():
        for option in other.options:
            if option.dest not in own and spec.given.get(option.dest) is not None:
                names = " or ".join(m.name for m in chosen)
                raise CompressorError(f"{option.flag} is an option of --method {name}, not of {names}")
    dests = list(dict.fromkeys(o.dest for m in chosen for o in m.options))
    given = {d: spec.given.get(d) for d in dests}
    if default_fit is not None and given.get("fit") is None:
        given["fit"] = default_fit
    lists = [v if isinstance(v, list | tuple) else [v] for v in given.values()]
    sets = []
    for combo in itertools.product(*lists):
        values = dict(zip(dests, combo))
        sets.append(tuple(m.from_options({o.dest: values[o.dest] for o in m.options}) for m in chosen))
    return sets


@functools.cache
def plans_of(spec: MethodSpec, default_fit: str | None = None) -> tuple[Plan, ...]:
    """One plan from the plan file, else one per combination of the method's option values (a budget
    plan needs the model and is made by plans_and_calibration); `default_fit` as config_sets. Made
    once per spec: every later step reuses them."""
    if spec.plan is not None:
        if not spec.plan.is_file():
            raise CompressorError(f"plan file {str(spec.plan)!r} does not exist")
        plan = Plan.from_json(spec.plan.read_text())
        if plan.widths:
            raise CompressorError(
                f"plan file {str(spec.plan)!r} gives widths, which run's byte budget chooses (--budget SIZE --quantize "
                "mixed); leave them out of a plan file"
            )
        return (plan,)
    if len(spec.methods) > 1 and spec.budget is None:
        raise CompressorError(
            f"--method {' '.join(spec.methods)} needs --budget, which chooses among them layer by layer; without "
            "it name one method, or map targets to methods in a --plan"
        )
    sets = config_sets(spec, default_fit)
    return tuple(Plan(tuple((t, cfg) for t in spec.targets for cfg in configs)) for configs in sets)
