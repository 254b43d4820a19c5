"""What `run` and `sweep` do, in order: every variant's options checked before any work, the model's
kind, texts and quantization calibration read once; then, in the output folder, the original and
each variant made (compressed, fine-tuned), exported, quantized and benched side by side. `run` is
a sweep of one variant, its own options; `sweep` one variant per recipe."""

import argparse
from dataclasses import dataclass

from converters.cli.calibrating import quantize_calibration
from converters.cli.options import export_form_values
from converters.cli.steps import (
    check_kind_options,
    check_method_options,
    check_plans,
    check_runs,
    correction_fit,
    eval_texts,
    finetune_config,
    finetune_texts,
    load_original,
    say,
    second_texts,
)
from converters.cli.variants import Variants, output_folder
from converters.export import check_export_forms
from converters.kinds import kind_for_config
from converters.loading import resolve_model_dir

__all__ = ["Variant", "fine_tunes", "measure"]


@dataclass(frozen=True)
class Variant:
    """One compressed variant of a measurement: `space` holds `compressor run`'s options for it; `fp32`:
    its unquantized graph measured too; `said`: a line said before it is made."""

    space: argparse.Namespace
    name: str | None = None
    fp32: bool = True
    said: str | None = None


def fine_tunes(space: argparse.Namespace) -> bool:
    return (space.ft_steps is not None or space.ft_time is not None) and space.ft_steps != 0


def measure(args: argparse.Namespace, variants: list[Variant]) -> None:
    """The original and every variant side by side in `args.out`, benched with `args`' settings; the
    int4 settings are the first variant's (run's own, or its defaults in a sweep)."""
    check_runs(args.runs)
    for variant in variants:
        check_method_options(variant.space)  # the cache folder too, now that --no-cache is known
        if fine_tunes(variant.space):
            finetune_config(variant.space)  # a bad budget or text fails now, not after the compression
    source = resolve_model_dir(args.model)
    kind = kind_for_config(source)
    for variant in variants:
        check_kind_options(variant.space, kind)
    texts, second = eval_texts(args, kind.graph), second_texts(args, kind.graph)
    schemes = list(dict.fromkeys(s for variant in variants for s in variant.space.quantize or []))
    batches = quantize_calibration(args, [*kind.baselines, *schemes], kind.graph, source)
    fit_for = correction_fit(args, schemes, kind, source)
    ft_texts = finetune_texts(args, kind) if any(fine_tunes(v.space) for v in variants) else None
    with output_folder(args.out):
        original, source = load_original(args.model)
        for variant in variants:  # every plan against the model's modules, before the original is exported
            plans = check_plans(variant.space, original)
            check_export_forms(export_form_values(variant.space), original, plans)
        first = variants[0].space
        int4 = (first.block_size, first.accuracy_level, first.correction_share)
        vocab = original.get_input_embeddings().num_embeddings
        made = Variants(args.out, source, vocab, batches, *int4, fit_for=fit_for, table_head=first.table_head)
        made.add_original(original, [*kind.baselines, *schemes])
        for variant in variants:
            if variant.said:
                say(variant.said)
            tuned = ft_texts if fine_tunes(variant.space) else None
            quantize = variant.space.quantize or []
            made.add_compressed(variant.space, original, source, tuned, quantize, variant.name, fp32=variant.fp32)
        made.bench_and_report(args, source, texts, second)
