"""The command line's parsed options made into the typed spec the pipeline reads (converters.spec),
once, where a command starts: the only place an option's parsed value becomes a spec field. A
recipe's options (converters/cli/recipes.py) come through the same functions."""

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from converters.export import export_form_rows
from converters.finetune.config import FinetuneConfig
from converters.kinds import KINDS
from converters.quantization.registry import scheme_options
from converters.registry import default_method, export_forms, methods
from converters.spec import QUANTIZE_ONLY, ExportSpec, MethodSpec, QuantizeSpec, RunSpec, TextSpec, VariantSpec
from texts.prior import PRIOR_WEIGHT, PRIORS, check_wordfreq

__all__ = ["text_spec", "method_spec", "quantize_spec", "finetune_config", "variant_spec", "run_spec", "export_spec"]

FINETUNE_DEFAULTS = FinetuneConfig()
# The fine-tune's options (their dests) → the config's fields
FINETUNE_DESTS = {
    "ft_steps": "steps",
    "ft_time": "seconds",
    "ft_device": "device",
    "lr": "lr",
    "linear_lr": "linear_lr",
    "rest_lr": "rest_lr",
    "layer_weight": "layer_weight",
    "rare_share": "rare_share",
    "synthetic": "synthetic",
    "schedule": "schedule",
    "trainable": "trainable",
    "batch_size": "batch_size",
    "temperature": "temperature",
}


def _get(values: Mapping[str, Any], dest: str, default: Any = None) -> Any:
    """A parsed option's value; `default` where the command has no such option."""
    value = values.get(dest)
    return default if value is None else value


def text_spec(values: Mapping[str, Any]) -> TextSpec:
    """The texts of a command's options (those it lacks keep the spec's defaults)."""
    default = TextSpec()
    return TextSpec(
        calib=values.get("calib"),
        calib_passages=_get(values, "calib_passages", default.calib_passages),
        no_cache=bool(values.get("no_cache")),
        data=values.get("data"),
        eval_text=values.get("eval_text"),
        second_text=values.get("second_text"),
        eval_passages=values.get("eval_passages"),
    )


def _frozen(value: Any) -> Any:
    """A list of values (one variant each) as a tuple, so that a spec can be hashed; a list of one as
    its value, as a recipe gives it."""
    if not isinstance(value, list):
        return value
    return value[0] if len(value) == 1 else tuple(value)


def method_spec(values: Mapping[str, Any], quantize: QuantizeSpec | None = None) -> MethodSpec:
    """--method (one name, or several; none: the registry's default), each registered method's options that were
    given, --targets, --budget, --plan, the prior; the budget's widths too with a planned scheme of `quantize`
    (mixed)."""
    method = values.get("method") or default_method().name
    names = (method,) if isinstance(method, str) else tuple(dict.fromkeys(method))
    dests = dict.fromkeys(o.dest for m in methods().values() for o in m.options)
    default = MethodSpec(names)
    return MethodSpec(
        names,
        options=tuple((d, _frozen(values[d])) for d in dests if values.get(d) is not None),
        targets=tuple(_get(values, "targets", default.targets)),
        budget=None if values.get("budget") is None else str(values["budget"]),
        plan=values.get("plan"),
        freq_prior=_get(values, "freq_prior", default.freq_prior),
        prior_weight=_get(values, "prior_weight", default.prior_weight),
        planned=next((c for c in quantize.schemes if c.planned), None) if quantize else None,
    )


def quantize_spec(values: Mapping[str, Any]) -> QuantizeSpec:
    """--quantize (one scheme, or several) and the scheme options given, checked."""
    quantize = values.get("quantize")
    names = (quantize,) if isinstance(quantize, str) else tuple(quantize or ())
    return QuantizeSpec.of(names, tuple((d, values[d]) for d in scheme_options() if values.get(d) is not None))


def finetune_config(
    values: Mapping[str, Any], defaults: FinetuneConfig = FINETUNE_DEFAULTS, budgets: bool = False
) -> FinetuneConfig:
    """The fine-tune's config: `defaults` (a command's own, as its help says them) with the options given, checked
    (with --synthetic, the prior's package too); `budgets`: the step and time budgets are the ones given alone
    (run's: a fine-tune only when one is)."""
    given = {name: values[dest] for dest, name in FINETUNE_DESTS.items() if values.get(dest) is not None}
    if budgets:
        given.update(steps=values.get("ft_steps"), seconds=values.get("ft_time"))
    cfg = replace(defaults, **given)
    if cfg.synthetic > 0:
        check_wordfreq("pass --synthetic 0: its sequences are drawn from wordfreq's English word frequencies")
    return cfg


def kind_options(values: Mapping[str, Any]) -> tuple[str, ...]:
    """The options given that only some model kinds take (their dests)."""
    return tuple(d for kind in KINDS for d in kind.options if values.get(d) is not None)


def variant_spec(values: Mapping[str, Any], name: str | None = None, fp32: bool = True, said=None) -> VariantSpec:
    """One variant from run's options (or a recipe's, over run's defaults): no fine-tune unless a step
    or time budget is given, and none with 0 steps; method QUANTIZE_ONLY: the original's rows in its
    schemes and settings, named NAME-SCHEME (NAME "original" unless given), its fp32 graph the original's."""
    tunes = (values.get("ft_steps") is not None or values.get("ft_time") is not None) and values.get("ft_steps") != 0
    forms = [o.dest for f in export_forms().values() for o in (f.option, *f.options)]
    quantize = quantize_spec(values)
    return VariantSpec(
        None if values["method"] == QUANTIZE_ONLY else method_spec(values, quantize),
        quantize,
        finetune_config(values, budgets=True) if tunes else None,
        export_forms=tuple((d, values.get(d)) for d in forms),
        kind_options=kind_options(values),
        name=name or ("original" if values["method"] == QUANTIZE_ONLY else None),
        fp32=fp32 and values["method"] != QUANTIZE_ONLY,
        said=said,
    )


def run_spec(values: Mapping[str, Any], variants: list[VariantSpec], out: Path) -> RunSpec:
    """A run or a sweep: the model, `out`, the texts, `variants`, the bench's runs and the prior (run's)."""
    return RunSpec(
        values.get("model"),
        out,
        text_spec(values),
        tuple(variants),
        runs=values["runs"],
        freq_prior=_get(values, "freq_prior", PRIORS[0]),
        prior_weight=_get(values, "prior_weight", PRIOR_WEIGHT),
        goal=values.get("goal"),
        kv_cache=_get(values, "kv_cache", "int8"),
        shortlist=values.get("shortlist_rows"),
    )


def export_spec(values: Mapping[str, Any], source: Path, forms: dict[str, Any]) -> ExportSpec:
    """An export of the model folder `source` (resolved from --model) in the export form `forms` (the form options'
    values, by dest): --out, else MODEL_DIR-onnx beside the folder ("original" for the default model), -FORM and
    -SCHEME added for a form other than the default and a scheme; the schemes and texts checked as they are made."""
    stem = (source.parent / source.name) if values.get("model") else Path("original")
    suffix = f"-{values['quantize']}" if values.get("quantize") else ""
    (form, _), *_ = export_form_rows(forms)
    out = values.get("out") or stem.with_name(f"{stem.name}{form}{suffix}-onnx")
    return ExportSpec(
        source,
        out,
        quantize_spec(values),
        text_spec(values),
        export_forms=forms,
        opset=values["opset"],
        freq_prior=_get(values, "freq_prior", PRIORS[0]),
        prior_weight=_get(values, "prior_weight", PRIOR_WEIGHT),
        kv_cache=_get(values, "kv_cache", "fp32"),
        shortlist=values.get("shortlist"),
        shortlist_rank=values.get("shortlist_rank"),
    )
