"""The refusals of run, sweep, compress and export, each one sentence before any work, in one place: what the spec
asks, checked before the model loads (check_run, check_method_options, check_export), against the model's kind once
it is read (check_spec, check_kind_options, check_schemes; export's in check_export), and export's two that need the
loaded model (check_fused). A plan against the model's modules is steps.check_plans's."""

import json
from dataclasses import replace

from torch import nn

from compressor.errors import CompressorError
from converters.budget import parse_budget
from converters.calibration import default_cache_dir
from converters.kinds import KINDS, ModelKind
from converters.kinds.fused_decoder import fits_fused
from converters.pipeline.plans import plans_of
from converters.quantization.shortlist_head import SHORTLIST_RANK, check_shortlist
from converters.registry import method_named, method_of, methods
from converters.spec import ExportSpec, MethodSpec, QuantizeSpec, RunSpec, TextSpec, VariantSpec
from eval.kinds import CAUSAL_LM
from files.atomic import check_writable
from files.model_folder import check_model_folder
from texts.corpus import read_passages
from texts.prior import check_prior

__all__ = [
    "check_budget",
    "check_method_options",
    "check_schemes",
    "check_kind_options",
    "check_run",
    "check_quantize_only",
    "check_spec",
    "check_export",
    "check_fused",
]


def check_budget(spec: MethodSpec) -> None:
    """--budget with methods that have a budget rule, no plan file and no option the budget chooses; its size
    parsed."""
    budgeted = [name for name, m in methods().items() if m.budget is not None]
    chosen = [method_named(name) for name in spec.methods]
    unruled = [m.name for m in chosen if m.budget is None]
    if unruled or spec.plan is not None:
        why = f"; {unruled[0]} has no budget rule" if unruled else ""
        raise CompressorError(
            f"--budget chooses sizes under one budget: use it with --method {' or '.join(budgeted)} (or several of "
            f"them) and without --plan{why}"
        )
    for method in chosen:
        for dest in method.budget.sets:
            if spec.given.get(dest) is not None:
                what = method.budget.size if method.budget.size.endswith("s") else f"{method.budget.size}s"
                raise CompressorError(f"--budget chooses the {what}: leave out --{dest.replace('_', '-')}")
    parse_budget(spec.budget)


def _check_mixed(spec: MethodSpec) -> None:
    """A planned scheme (--quantize mixed) needs a byte budget to choose widths in."""
    if not spec.planned:
        return
    if spec.budget is None or parse_budget(spec.budget)[0] != "bytes":
        raise CompressorError(
            f"--quantize {spec.planned.scheme} chooses each layer's rank and width under one budget in bytes: give "
            f"--budget SIZE (such as 12MB), got {'no --budget' if spec.budget is None else repr(spec.budget)}"
        )


def check_method_options(spec: MethodSpec, texts: TextSpec) -> None:
    """The method options, the plan file and the budget, checked before any model is loaded; and
    when the plans will calibrate, the calibration text given and the cache folder (unless no_cache)."""
    _check_mixed(spec)
    check_prior(spec.freq_prior, spec.prior_weight)
    if spec.budget is not None:
        check_budget(spec)
    plans = plans_of(spec)
    calibrates = spec.budget is not None or any(
        method_of(cfg).needs_calibration(cfg) for plan in plans for _, cfg in plan.entries
    )
    if calibrates and texts.calib is not None:
        read_passages(texts.calib)  # a missing or unreadable text fails now, not after the original's export
    if calibrates and not texts.no_cache:
        try:
            check_writable(default_cache_dir(), "calibration cache folder")
        except CompressorError as e:
            raise CompressorError(f"{e}; pass --no-cache to calibrate without one") from None


def check_schemes(quantizes, kind_graph) -> None:
    """Every scheme of the QuantizeSpecs `quantizes` against the graph kind it will quantize (SchemeConfig.check: an
    LM's graph refuses int8 products, a 3-bit table or linear layers), before any work."""
    for quantize in quantizes:
        for config in quantize.schemes:
            config.check(kind_graph)


def check_kind_options(given: tuple[str, ...], kind: ModelKind) -> None:
    """No option given (`given`: their dests) that only another model kind takes (a language model's
    --temperature on an encoder)."""
    for other in KINDS:
        for dest in other.options:
            if dest not in kind.options and dest in given:
                flag = "--" + dest.replace("_", "-")
                raise CompressorError(f"{flag} is an option of {other.name} models; this model is an {kind.name}")


def check_run(run: RunSpec) -> None:
    """What can be checked before the model loads: each variant's method options, plan file, budget,
    calibration text and cache folder; the run's prior where a table head asks for it."""
    for variant in run.variants:
        if variant.method is not None:
            check_method_options(variant.method, run.texts)
    if any(config.head_rows for variant in run.variants for config in variant.quantize.schemes):
        check_prior(run.freq_prior, run.prior_weight)


def check_quantize_only(variant: VariantSpec) -> None:
    """A variant of no method (the original, only quantized) asks no fine-tune, export form or planned width."""
    planned = [c.scheme for c in variant.quantize.schemes if c.planned]
    if planned:
        raise CompressorError(
            f"{variant.name!r} is the original, only quantized: --quantize {planned[0]} takes each layer's width from "
            "a compressed variant's budget (give --budget SIZE with a method)"
        )
    if variant.finetune is not None or any(v for _, v in variant.export_forms):
        raise CompressorError(
            f"{variant.name!r} is the original, only quantized, with nothing to fine-tune or export in another "
            "form: give a method option (--method, --rank, …) to make a compressed variant"
        )


def check_spec(run: RunSpec, kind: ModelKind, original: QuantizeSpec) -> None:
    """The whole spec against the model's kind, once, before any work: each variant's options that only another
    kind takes, what a variant of no method asks, every row's scheme (the original's rows, `original`, too) against
    the kind's graph (check_schemes), and the rows' names."""
    for variant in run.variants:
        check_kind_options(variant.kind_options, kind)
        if variant.method is None:
            check_quantize_only(variant)
    check_schemes([original, *(variant.quantize for variant in run.variants)], kind.graph)
    rounded = [f"original-{c.scheme}" for c in original.schemes]
    rounded += [f"{v.name}-{c.scheme}" for v in run.variants if v.method is None for c in v.quantize.schemes]
    twice = sorted({row for row in rounded if rounded.count(row) > 1})
    if twice:
        raise CompressorError(f"two rows are named {twice[0]!r}; give the variants of no method different names")


def check_export(spec: ExportSpec, kind: ModelKind) -> ExportSpec:
    """Every refusal of an export that needs no model loaded, before any work: a planned scheme, several CPUs' graphs
    without a folder, the output (a folder compressor writes, or a file) writable, the prior, the key-value cache and
    the shortlist of a causal LM alone, the shortlist's sizes and scheme, the scheme against the kind's graph. The
    spec with the shortlist's rank (asked, or SHORTLIST_RANK and at most half the hidden width)."""
    config, source = spec.config, spec.source
    if config is not None and config.planned:
        raise CompressorError(
            f"--quantize {config.scheme} takes each layer's width from a byte budget: use compressor run --budget SIZE "
            f"--quantize {config.scheme}"
        )
    if config is not None and len(config.targets()) > 1 and not spec.folder:
        raise CompressorError(
            f"--target-cpu {config.target_cpu} writes one graph for each CPU into a model folder: give --out a folder"
        )
    if spec.folder:
        check_model_folder(spec.out)
        check_writable(spec.out, "model folder")
    else:
        check_writable(spec.out, "ONNX file")
    check_prior(spec.freq_prior, spec.prior_weight)
    if spec.kv_cache != "fp32" and kind.graph is not CAUSAL_LM:
        raise CompressorError(
            f"--kv-cache {spec.kv_cache} is a causal LM's cache; {str(source)!r} is a model of the {kind.name} kind"
        )
    if spec.shortlist is None and spec.shortlist_rank is not None:
        raise CompressorError("--shortlist-rank sets the rank of a shortlist head: give --shortlist K with it")
    rank = _check_shortlist(spec, kind) if spec.shortlist is not None else None
    check_schemes([spec.quantize], kind.graph)
    return replace(spec, shortlist_rank=rank)


def _check_shortlist(spec: ExportSpec, kind: ModelKind) -> int:
    """The shortlist's rank (asked, or SHORTLIST_RANK and at most half the hidden width); one sentence before any work
    for a shortlist this model or scheme cannot take (shortlist_head.check_shortlist; the sizes from config.json)."""
    source = spec.source
    if kind.graph is not CAUSAL_LM:
        raise CompressorError(f"--shortlist is a causal LM's head; {str(source)!r} is a model of the {kind.name} kind")
    sizes = json.loads((source / "config.json").read_text())
    if not all(isinstance(sizes.get(key), int) for key in ("vocab_size", "hidden_size")):
        raise CompressorError(
            f"--shortlist reads the LM's vocab_size and hidden_size, which {str(source)!r}'s config.json lacks"
        )
    vocab, hidden = sizes["vocab_size"], sizes["hidden_size"]
    rank = min(SHORTLIST_RANK, hidden // 2) if spec.shortlist_rank is None else spec.shortlist_rank
    check_shortlist(spec.shortlist, rank, vocab, hidden, spec.config and spec.config.scheme)
    return rank


def check_fused(spec: ExportSpec, model: nn.Module) -> None:
    """An export's int8 key-value cache and shortlist, written into the fused decoder's graph, against the loaded
    model: one the fused decoder takes (fits_fused), checked as soon as it is loaded."""
    source = spec.source
    if spec.kv_cache != "fp32" and not fits_fused(model):
        raise CompressorError(
            f"--kv-cache {spec.kv_cache} is written into the fused decoder's attention, and {str(source)!r} is not a "
            "Llama-style LM of plain layers that it takes (its graph is the PyTorch exporter's): keep --kv-cache fp32"
        )
    if spec.shortlist is not None and not fits_fused(model):
        raise CompressorError(
            f"--shortlist is written into the fused decoder's head, and {str(source)!r} is not a Llama-style LM of "
            "plain layers that it takes (its graph is the PyTorch exporter's)"
        )
