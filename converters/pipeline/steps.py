"""The steps a run takes, read from its spec (converters.spec): plans checked against the model, calibration,
compression, the fine-tune and the texts, each saying on stderr what it did; their refusals before any work are
checks.py's."""

import time
import warnings
from pathlib import Path

from torch import nn

from compressor.errors import CompressorError
from converters.budget import check_budget_fits, plan_for_budget
from converters.calibration import Calibration, statistics_bytes
from converters.checkpoint import is_compressed_dir, load_model, save_compressed
from converters.compress import CompressionReport, compress_
from converters.finetune import Distillation, FinetuneRun, finetune_
from converters.finetune.config import FinetuneConfig
from converters.kinds import ModelKind, kind_of
from converters.loading import available_memory
from converters.pipeline.calibrating import calibration
from converters.pipeline.checks import check_budget, check_method_options
from converters.pipeline.plans import config_sets, plans_of
from converters.pipeline.say import say
from converters.plan import WIDTHS, Plan, match_plan
from converters.quantization.corrections.training import TRAINED_MODULES
from converters.quantization.rounding.int4 import INT4_BLOCK
from converters.registry import compact_modules, handler_for, method_of
from converters.spec import MethodSpec, TextSpec
from texts.corpus import SECOND
from texts.prior import token_prior
from texts.tokens import load_tokenizer

__all__ = [
    "compress_checkpoint",
    "check_plans",
    "plans_and_calibration",
    "compress_and_say",
    "load_original",
    "eval_texts",
    "second_texts",
    "finetune_texts",
    "finetune_and_say",
    "correction_fit",
]


def _linear_names(model: nn.Module, plans) -> list[str]:
    """The linear layers the plans match (every module but tables: nn.Linear, Hugging Face's Conv1D)."""
    names = {
        n for plan in plans for n in match_plan(plan, model) if not isinstance(model.get_submodule(n), nn.Embedding)
    }
    return sorted(names)


def _widths(spec: MethodSpec) -> tuple[tuple[str, ...], int]:
    """(the widths a budget chooses among, the block of their 4 bits): all of them with a planned scheme (mixed),
    in its blocks, else none (sizes only)."""
    return (WIDTHS, spec.planned.block_size) if spec.planned else ((), INT4_BLOCK)


def check_plans(spec: MethodSpec, model: nn.Module) -> tuple[Plan, ...] | None:
    """Every plan checked against the loaded model, before anything is exported, calibrated or built:
    each module it matches × each config, by the method's own checks (handler_for: the method takes
    the module, and its shapes fit: a dense head leaves a tail, PHM's n divides both dimensions, …);
    with a budget, every config set by check_budget_fits (the same checks, and a budget that can
    hold every module at its smallest size). The plans; None with a budget (they need calibration)."""
    if spec.budget is not None:
        check_budget(spec)
        for configs in config_sets(spec):
            check_budget_fits(model, spec.targets, spec.budget, configs, *_widths(spec))
        return None
    plans = plans_of(spec)
    for plan in plans:
        for name, (_, cfg) in match_plan(plan, model).items():
            handler_for(name, model.get_submodule(name), cfg)
    return plans


def _lighter_fit(spec: MethodSpec, model: nn.Module, linear: list[str], sensitivity: bool) -> str | None:
    """The fit "aware" when the default (fisher) was not asked for by name and its output sensitivities
    would not fit in the memory left (said); None: the plans stand."""
    if not sensitivity or spec.given.get("fit") is not None or spec.plan is not None:
        return None
    need, free = statistics_bytes(model, linear, True), available_memory()
    if not free or need <= free:
        return None
    say(
        f"the default fit, fisher, needs output sensitivities and Grams of up to {need / 2**30:.1f} GiB and "
        f"{free / 2**30:.1f} GiB are available: this model is fitted with --fit aware"
    )
    return "aware"


def plans_and_calibration(
    spec: MethodSpec, texts: TextSpec, model: nn.Module, source: Path
) -> tuple[tuple[Plan, ...], Calibration | None]:
    """The plans to apply (checked first: check_plans), and calibration statistics when any of them needs data;
    the default fit lighter where its statistics would not fit (_lighter_fit)."""
    plans = check_plans(spec, model)
    if spec.budget is not None:
        sets = config_sets(spec)
        probes = [Plan(tuple((t, cfg) for t in spec.targets)) for configs in sets for cfg in configs]
        linear = _linear_names(model, probes)
        sensitivity = any(method_of(cfg).needs_sensitivity(cfg) for configs in sets for cfg in configs)
        if fit := _lighter_fit(spec, model, linear, sensitivity):
            sets, sensitivity = config_sets(spec, fit), False
        calib = calibration(texts, spec, model, source, linear, sensitivity)
        widths = _widths(spec)
        plans = tuple(plan_for_budget(model, spec.targets, spec.budget, calib, c, *widths) for c in sets)
        return plans, calib
    methods_of = [(method_of(cfg), cfg) for plan in plans for _, cfg in match_plan(plan, model).values()]
    if not any(m.needs_calibration(cfg) for m, cfg in methods_of):
        return plans, None
    linear = _linear_names(model, plans)
    sensitivity = any(m.needs_sensitivity(cfg) for m, cfg in methods_of)
    if fit := _lighter_fit(spec, model, linear, sensitivity):
        plans, sensitivity = plans_of(spec, fit), False
    return plans, calibration(texts, spec, model, source, linear, sensitivity)


def compress_checkpoint(model: str | Path | None, spec: MethodSpec, texts: TextSpec, out: Path) -> Plan:
    """The model (None: the default one) compressed by the spec's plan and saved as a checkpoint in
    `out`; the plan. Every option is checked before the model loads."""
    check_method_options(spec, texts)
    original, source = load_original(model)
    plans, calib = plans_and_calibration(spec, texts, original, source)
    report = compress_and_say(original, plans[0], calib)
    save_compressed(original, plans[0], report, source, out)
    return plans[0]


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


def _held_out(texts: TextSpec, kind_graph, path, text: str, parameters: int | None) -> tuple[list[str], str]:
    """The passages of the held-out `text` (eval, second): from `path`, else the kind's default;
    cut to eval_passages, else to what the kind reads for a model of `parameters` (GraphKind.held_out_count)."""
    passages, where = kind_graph.passages(path, text)
    if texts.eval_passages is not None:
        if texts.eval_passages < kind_graph.min_passages:
            raise CompressorError(
                f"--eval-passages must be at least {kind_graph.min_passages} (recall@10), got {texts.eval_passages}"
            )
        return passages[: texts.eval_passages], where
    count = kind_graph.held_out_count(len(passages), parameters)
    if count < len(passages):
        cut = f"the first {count} of its {len(passages)} passages at {parameters / 1e9:.2f}B parameters"
        say(f"{text} text: {cut}, to bound the bench's quality (--eval-passages sets how many)")
        where = f"{where}; {cut}"
    return passages[:count], where


def eval_texts(texts: TextSpec, kind_graph, parameters: int | None = None) -> tuple[list[str], str]:
    """The held-out passages of the eval text (or the kind's default), cut to eval_passages or to what the kind
    reads for a model of `parameters`."""
    return _held_out(texts, kind_graph, texts.eval_text, "eval", parameters)


def second_texts(texts: TextSpec, kind_graph, parameters: int | None = None) -> tuple[list[str] | None, str | None]:
    """The second held-out text (or the kind's default: news articles, unlike the fit text in genre),
    cut as eval_texts; (None, None) with "none"."""
    if texts.second_text == "none":
        return None, None
    return _held_out(texts, kind_graph, texts.second_text, SECOND, parameters)


def finetune_texts(data: Path | None, kind: ModelKind) -> tuple[list[str], list[str], str]:
    """(train, validation, where) of the fine-tune text `data` (None: the kind's default): the last
    tenth, at most 64 passages, is held out."""
    texts, where = kind.graph.passages(data, "finetune", minimum=2)
    held = max(1, min(64, len(texts) // 10))
    return texts[:-held], texts[-held:], where


def finetune_and_say(
    student: nn.Module,
    teacher: nn.Module,
    source: Path,
    cfg: FinetuneConfig,
    texts,
    run: FinetuneRun | None = None,
) -> dict:
    """Distil `teacher` into `student` in place by `cfg` on `texts` (train, validation, where), run as `run` says
    (its state file, a resume, FSDP; None: the defaults); what happened, for the checkpoint and the report."""
    train, val, where = texts
    compact = tuple(compact_modules().values())
    tokenizer = load_tokenizer(source)
    vocab = student.get_input_embeddings().num_embeddings
    prior = token_prior(tokenizer, vocab) if cfg.synthetic > 0 else None
    job = Distillation(student, teacher, tokenizer, train, val, compact, prior=prior)
    report = finetune_(job, cfg, run or FinetuneRun())
    say(
        f"fine-tune on {where} ({len(train)} passages, {len(val)} held out) on {report.device}: {report.steps} steps "
        f"in {report.seconds:.0f} s ({report.steps_per_second:.2f} steps/s, {report.tokens_per_second:,.0f} tokens/s); "
        f"{kind_of(student).agreement_name} "
        f"{report.start_val_cosine:.4f} → {report.best_val_cosine:.4f} (best at step {report.best_step})"
        + (f"; {report.stopped}" if report.stopped else "")
    )
    return {"config": dict(vars(cfg)), "data": where, **report.to_dict()}


def correction_fit(schemes, data: Path | None, kind: ModelKind, source: Path):
    """For the trained schemes (int4-trained, w4a8): (model, config, row) → the fine-tune of a student of its
    rounded graph (its TRAINED_MODULES, against `model`) on the fine-tune text `data`, for the config's
    `correction_time` seconds at its `correction_lr`, said as `row`'s; None when none of the configs `schemes`
    trains corrections."""
    named = " and ".join(dict.fromkeys(config.scheme for config in schemes if config.trains))
    if not named:
        return None
    train, val, where = finetune_texts(data, kind)
    tokenizer = load_tokenizer(source)
    say(
        f"{named}: each graph so quantized takes int4-corrected's time (each linear layer's loss at its width, "
        "about 2 s a layer for MiniLM on 2 cores) and then its --correction-time of training"
    )

    def fit_for(model: nn.Module, config, row: str):
        cfg = FinetuneConfig(seconds=config.correction_time, linear_lr=config.correction_lr)

        def fit(student: nn.Module) -> None:
            if not any(isinstance(m, TRAINED_MODULES) for m in student.modules()):
                say(
                    f"{row}: nothing to train (each layer's rounding taken by its offsets or a tied head's codes, no "
                    "correction, no norm held by one node): it stays as int4-corrected fits it"
                )
                return
            report = finetune_(Distillation(student, model, tokenizer, train, val, TRAINED_MODULES), cfg)
            say(
                f"{row}: the corrections trained on {where} for {report.steps} steps in {report.seconds:.0f} "
                f"s; {kind.agreement_name} {report.start_val_cosine:.4f} → {report.best_val_cosine:.4f}"
            )

        return fit

    return fit_for
