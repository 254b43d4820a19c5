"""The steps the commands share: plans from the options, calibration, compression, the fine-tune
and the texts, each saying on stderr what it did."""

import argparse
import itertools
import time
import warnings
from pathlib import Path

from torch import nn

from compressor.corrected_linear import CorrectedLinear
from compressor.errors import CompressorError
from converters.budget import check_budget_fits, parse_budget, plan_for_budget
from converters.calibration import (
    Calibration,
    default_cache_dir,
    statistics_bytes,
)
from converters.checkpoint import is_compressed_dir, load_model
from converters.cli.calibrating import calibration
from converters.cli.say import say
from converters.compress import CompressionReport, compress_
from converters.finetune import FinetuneConfig, finetune_
from converters.kinds import KINDS, ModelKind, kind_of
from converters.loading import available_memory
from converters.plan import WIDTHS, Plan, match_plan
from converters.quantization.int4 import INT4_BLOCK
from converters.quantization.quantize import TRAINED
from converters.quantization.training import CORRECTION_LR, CORRECTION_SECONDS, GraphLayerNorm
from converters.registry import compact_modules, handler_for, method_named, method_of, methods
from files.atomic import check_writable
from texts.corpus import SECOND, read_passages
from texts.prior import check_prior, check_wordfreq, token_prior
from texts.tokens import load_tokenizer

__all__ = [
    "say",
    "check_outputs",
    "plans_from_args",
    "check_method_options",
    "check_plans",
    "plans_and_calibration",
    "compress_and_say",
    "load_original",
    "eval_texts",
    "second_texts",
    "check_runs",
    "finetune_config",
    "check_kind_options",
    "finetune_texts",
    "finetune_and_say",
    "correction_fit",
]


def check_outputs(args, **outputs: Path) -> None:
    """Before any work: every output (what=path) can be written."""
    for what, path in outputs.items():
        check_writable(path, what.replace("_", " "))


def _method_names(args: argparse.Namespace) -> list[str]:
    """The methods of --method: the names given (a recipe gives one, as text)."""
    return [args.method] if isinstance(args.method, str) else list(dict.fromkeys(args.method))


def _config_sets(args: argparse.Namespace, default_fit: str | None = None) -> list[tuple]:
    """One config per method of --method, for each combination of the values given to their options
    (in their order); a flag the methods share gives each of them the same value. `default_fit`: the
    fit where --fit was not given (else each method's own default)."""
    chosen = [method_named(name) for name in _method_names(args)]
    own = {o.dest for m in chosen for o in m.options}
    for name, other in methods().items():
        for option in other.options:
            if option.dest not in own and getattr(args, option.dest, None) is not None:
                names = " or ".join(m.name for m in chosen)
                raise CompressorError(f"{option.flag} is an option of --method {name}, not of {names}")
    dests = list(dict.fromkeys(o.dest for m in chosen for o in m.options))
    given = {d: getattr(args, d, None) for d in dests}
    if default_fit is not None and given.get("fit") is None:
        given["fit"] = default_fit
    lists = [v if isinstance(v, list) else [v] for v in given.values()]
    sets = []
    for combo in itertools.product(*lists):
        values = dict(zip(dests, combo))
        sets.append(tuple(m.from_options({o.dest: values[o.dest] for o in m.options}) for m in chosen))
    return sets


def plans_from_args(args: argparse.Namespace, default_fit: str | None = None) -> list[Plan]:
    """One plan from --plan, else one per combination of the method's option values (a --budget
    plan needs the model and is made by plans_and_calibration); `default_fit` as _config_sets."""
    if args.plan is not None:
        if not args.plan.is_file():
            raise CompressorError(f"plan file {str(args.plan)!r} does not exist")
        plan = Plan.from_json(args.plan.read_text())
        if plan.widths:
            raise CompressorError(
                f"plan file {str(args.plan)!r} gives widths, which run's byte budget chooses (--budget SIZE --quantize "
                "mixed); leave them out of a plan file"
            )
        return [plan]
    names = _method_names(args)
    if len(names) > 1 and args.budget is None:
        raise CompressorError(
            f"--method {' '.join(names)} needs --budget, which chooses among them layer by layer; without it "
            "name one method, or map targets to methods in a --plan"
        )
    sets = _config_sets(args, default_fit)
    return [Plan(tuple((t, cfg) for t in args.targets for cfg in configs)) for configs in sets]


def _linear_names(model: nn.Module, plans: list[Plan]) -> list[str]:
    """The linear layers the plans match (every module but tables: nn.Linear, Hugging Face's Conv1D)."""
    names = {
        n for plan in plans for n in match_plan(plan, model) if not isinstance(model.get_submodule(n), nn.Embedding)
    }
    return sorted(names)


def _check_budget(args: argparse.Namespace) -> None:
    budgeted = [name for name, m in methods().items() if m.budget is not None]
    chosen = [method_named(name) for name in _method_names(args)]
    unruled = [m.name for m in chosen if m.budget is None]
    if unruled or args.plan is not None:
        why = f"; {unruled[0]} has no budget rule" if unruled else ""
        raise CompressorError(
            f"--budget chooses sizes under one budget: use it with --method {' or '.join(budgeted)} (or several of "
            f"them) and without --plan{why}"
        )
    for method in chosen:
        for dest in method.budget.sets:
            if getattr(args, dest, None) is not None:
                what = method.budget.size if method.budget.size.endswith("s") else f"{method.budget.size}s"
                raise CompressorError(f"--budget chooses the {what}: leave out --{dest.replace('_', '-')}")
    parse_budget(args.budget)


def _widths(args: argparse.Namespace) -> tuple[str, ...]:
    """The widths a budget chooses among: all of them with --quantize mixed, else none (sizes only)."""
    return WIDTHS if "mixed" in (getattr(args, "quantize", None) or ()) else ()


def _check_mixed(args: argparse.Namespace) -> None:
    """--quantize mixed needs a byte budget to choose widths in."""
    if not _widths(args):
        return
    if args.budget is None or parse_budget(args.budget)[0] != "bytes":
        raise CompressorError(
            "--quantize mixed chooses each layer's rank and width under one budget in bytes: give --budget SIZE "
            f"(such as 12MB), got {'no --budget' if args.budget is None else repr(args.budget)}"
        )


def check_method_options(args: argparse.Namespace) -> None:
    """The method options, the plan file and the budget, checked before any model is loaded; and
    when the plans will calibrate, the calibration text given and the cache folder (unless --no-cache)."""
    _check_mixed(args)
    check_prior(args.freq_prior, args.prior_weight)
    if args.budget is not None:
        _check_budget(args)
    plans = plans_from_args(args)
    calibrates = args.budget is not None or any(
        method_of(cfg).needs_calibration(cfg) for plan in plans for _, cfg in plan.entries
    )
    if calibrates and args.calib is not None:
        read_passages(args.calib)  # a missing or unreadable text fails now, not after the original's export
    if calibrates and not args.no_cache:
        try:
            check_writable(default_cache_dir(), "calibration cache folder")
        except CompressorError as e:
            raise CompressorError(f"{e}; pass --no-cache to calibrate without one") from None


def check_plans(args: argparse.Namespace, model: nn.Module) -> list[Plan] | None:
    """Every plan checked against the loaded model, before anything is exported, calibrated or built:
    each module it matches × each config, by the method's own checks (handler_for: the method takes
    the module, and its shapes fit: a dense head leaves a tail, PHM's n divides both dimensions, …);
    with --budget, every config set by check_budget_fits (the same checks, and a budget that can
    hold every module at its smallest size). The plans; None with --budget (they need calibration)."""
    if args.budget is not None:
        _check_budget(args)
        for configs in _config_sets(args):
            check_budget_fits(model, args.targets, args.budget, configs, _widths(args), _block(args))
        return None
    plans = plans_from_args(args)
    for plan in plans:
        for name, (_, cfg) in match_plan(plan, model).items():
            handler_for(name, model.get_submodule(name), cfg)
    return plans


def _block(args: argparse.Namespace) -> int:
    return getattr(args, "block_size", None) or INT4_BLOCK


def _lighter_fit(args, model: nn.Module, linear: list[str], sensitivity: bool) -> str | None:
    """The fit "aware" when the default (fisher) was not asked for by name and its output sensitivities
    would not fit in the memory left (said); None: the plans stand."""
    if not sensitivity or getattr(args, "fit", None) is not None or args.plan is not None:
        return None
    need, free = statistics_bytes(model, linear, True), available_memory()
    if not free or need <= free:
        return None
    say(
        f"the default fit, fisher, needs output sensitivities and Grams of up to {need / 2**30:.1f} GiB and "
        f"{free / 2**30:.1f} GiB are available: this model is fitted with --fit aware"
    )
    return "aware"


def plans_and_calibration(args, model: nn.Module, source: Path) -> tuple[list[Plan], Calibration | None]:
    """The plans to apply (checked first: check_plans), and calibration statistics when any of them needs data;
    the default fit lighter where its statistics would not fit (_lighter_fit)."""
    plans = check_plans(args, model)
    if args.budget is not None:
        sets = _config_sets(args)
        probes = [Plan(tuple((t, cfg) for t in args.targets)) for configs in sets for cfg in configs]
        linear = _linear_names(model, probes)
        sensitivity = any(method_of(cfg).needs_sensitivity(cfg) for configs in sets for cfg in configs)
        if fit := _lighter_fit(args, model, linear, sensitivity):
            sets, sensitivity = _config_sets(args, fit), False
        calib = calibration(args, model, source, linear, sensitivity)
        widths, block = _widths(args), _block(args)
        plans = [plan_for_budget(model, args.targets, args.budget, calib, c, widths, block) for c in sets]
        return plans, calib
    methods_of = [(method_of(cfg), cfg) for plan in plans for _, cfg in match_plan(plan, model).values()]
    if not any(m.needs_calibration(cfg) for m, cfg in methods_of):
        return plans, None
    linear = _linear_names(model, plans)
    sensitivity = any(m.needs_sensitivity(cfg) for m, cfg in methods_of)
    if fit := _lighter_fit(args, model, linear, sensitivity):
        plans, sensitivity = plans_from_args(args, fit), False
    return plans, calibration(args, model, source, linear, sensitivity)


def _say_build_time(modules: int, seconds: float) -> None:
    say(f"compressing {modules} modules: about {seconds:.0f} s (from the first)")


def compress_and_say(model: nn.Module, plan: Plan, calib: Calibration | None) -> CompressionReport:
    """compress_, with each note (a clamped rank, …) and skip said once on stderr."""
    start = time.perf_counter()
    say(f"{plan.label()}: compressing {len(match_plan(plan, model))} module(s)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = compress_(model, plan, calib, on_estimate=_say_build_time)
    for note in report.notes:
        say(f"warning: {note}")
    for name, why in report.skipped.items():
        say(f"left dense: {name}: {why}")
    say(f"{plan.label()}: {len(report.modules)} module(s) compressed in {time.perf_counter() - start:.1f} s")
    return report


def load_original(model_arg) -> tuple[nn.Module, Path]:
    model, source = load_model(model_arg)
    if is_compressed_dir(source):
        raise CompressorError(f"{str(source)!r} is already a compressed checkpoint; start from the original model")
    return model, source


def _held_out(args, kind_graph, path, text: str) -> tuple[list[str], str]:
    """The passages of the held-out `text` (eval, second): from `path`, else the kind's default;
    cut to --eval-passages."""
    texts, where = kind_graph.passages(path, text)
    if args.eval_passages is not None:
        if args.eval_passages < kind_graph.min_passages:
            raise CompressorError(
                f"--eval-passages must be at least {kind_graph.min_passages} (recall@10), got {args.eval_passages}"
            )
        texts = texts[: args.eval_passages]
    return texts, where


def eval_texts(args, kind_graph) -> tuple[list[str], str]:
    """The held-out passages of --eval-text (or the kind's default), cut to --eval-passages."""
    return _held_out(args, kind_graph, args.eval_text, "eval")


def second_texts(args, kind_graph) -> tuple[list[str] | None, str | None]:
    """The second held-out text of --second-text (or the kind's default: news articles, unlike the
    fit text in genre), cut to --eval-passages; (None, None) with --second-text none."""
    if args.second_text == "none":
        return None, None
    return _held_out(args, kind_graph, args.second_text, SECOND)


def check_runs(runs: int) -> None:
    if runs < 1:
        raise CompressorError(f"--runs must be at least 1, got {runs}")


def finetune_config(args) -> FinetuneConfig:
    """The fine-tune's config from the options, checked (with --synthetic, the prior's package too)."""
    if args.synthetic > 0:
        check_wordfreq("pass --synthetic 0: its sequences are drawn from wordfreq's English word frequencies")
    return FinetuneConfig(
        steps=args.ft_steps,
        seconds=args.ft_time,
        lr=args.lr,
        linear_lr=args.linear_lr,
        rest_lr=args.rest_lr,
        layer_weight=args.layer_weight,
        rare_share=args.rare_share,
        synthetic=args.synthetic,
        schedule=args.schedule,
        trainable=args.trainable,
        batch_size=args.batch_size,
        temperature=1.0 if args.temperature is None else args.temperature,
    )


def check_kind_options(args, kind: ModelKind) -> None:
    """No option that only another model kind takes (a language model's --temperature on an encoder)."""
    for other in KINDS:
        for dest in other.options:
            if dest not in kind.options and getattr(args, dest, None) is not None:
                flag = "--" + dest.replace("_", "-")
                raise CompressorError(f"{flag} is an option of {other.name} models; this model is an {kind.name}")


def finetune_texts(args, kind: ModelKind) -> tuple[list[str], list[str], str]:
    """(train, validation, where): the last tenth, at most 64 passages, is held out."""
    texts, where = kind.graph.passages(getattr(args, "data", None), "finetune", minimum=2)
    held = max(1, min(64, len(texts) // 10))
    return texts[:-held], texts[-held:], where


def finetune_and_say(
    student: nn.Module, teacher: nn.Module, source: Path, args, texts, state=None, resume=False
) -> dict:
    """Distil `teacher` into `student` in place (`state`, `resume`: its state file, and whether to go on
    from it); what happened, for the checkpoint and the report."""
    cfg = finetune_config(args)
    train, val, where = texts
    compact = tuple(compact_modules().values())
    tokenizer = load_tokenizer(source)
    vocab = student.get_input_embeddings().num_embeddings
    prior = token_prior(tokenizer, vocab) if cfg.synthetic > 0 else None
    report = finetune_(student, teacher, tokenizer, train, val, cfg, compact, prior=prior, state=state, resume=resume)
    say(
        f"fine-tune on {where} ({len(train)} passages, {len(val)} held out) on {report.device}: {report.steps} steps "
        f"in {report.seconds:.0f} s ({report.steps_per_second:.2f} steps/s); {kind_of(student).agreement_name} "
        f"{report.start_val_cosine:.4f} → {report.best_val_cosine:.4f} (best at step {report.best_step})"
        + (f"; {report.stopped}" if report.stopped else "")
    )
    return {"config": dict(vars(cfg)), "data": where, **report.to_dict()}


def correction_fit(args, schemes: list[str], kind: ModelKind, source: Path):
    """For int4-trained: model → the fine-tune of a student of its rounded graph (its CorrectedLinear
    modules, against `model`) on the fine-tune text, for --correction-time seconds; None when no
    scheme of `schemes` trains corrections."""
    if not set(schemes) & set(TRAINED):
        return None
    seconds = getattr(args, "correction_time", CORRECTION_SECONDS)
    cfg = FinetuneConfig(seconds=seconds, linear_lr=CORRECTION_LR)  # a bad time fails now
    train, val, where = finetune_texts(args, kind)
    tokenizer = load_tokenizer(source)
    say(
        f"int4-trained: each graph so quantized takes int4-corrected's time (each linear layer's 4-bit loss, about "
        f"2.5 s a layer for MiniLM on 2 cores) and then {seconds:g} s of training (--correction-time)"
    )

    def fit_for(model: nn.Module):
        def fit(student: nn.Module) -> None:
            report = finetune_(student, model, tokenizer, train, val, cfg, (CorrectedLinear, GraphLayerNorm))
            say(
                f"int4-trained: the corrections trained on {where} for {report.steps} steps in {report.seconds:.0f} "
                f"s; {kind.agreement_name} {report.start_val_cosine:.4f} → {report.best_val_cosine:.4f}"
            )

        return fit

    return fit_for
