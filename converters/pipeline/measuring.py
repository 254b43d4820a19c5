"""What `run` and `sweep` do, in order: every variant's options checked before any work, the model's
kind, texts and quantization calibration read once; then, in the output folder, the original and
each variant made (compressed, fine-tuned), exported, quantized and benched side by side. `run` is
a sweep of one variant; `sweep` one variant per recipe."""

import functools
import sys

from converters.export import check_export_forms
from converters.kinds import kind_for_config
from converters.loading import DEFAULT_MODEL_NAME, resolve_model_dir, stored_parameters
from converters.pipeline.calibrating import head_frequencies, quantize_calibration, token_frequencies
from converters.pipeline.checks import check_run, check_spec
from converters.pipeline.rows_manifest import Pending, write_manifest
from converters.pipeline.say import say
from converters.pipeline.steps import (
    check_plans,
    correction_fit,
    eval_texts,
    finetune_texts,
    load_original,
    second_texts,
)
from converters.pipeline.torch_free import round_and_bench
from converters.pipeline.variants import Variants, output_folder
from converters.spec import QuantizeSpec, RunSpec
from eval.benchmark import bench_inputs
from eval.environment import batches_sha256, texts_sha256

__all__ = ["original_rows", "measure"]


def original_rows(run: RunSpec, baselines) -> QuantizeSpec:
    """The original's own rows: its kind's `baselines` and each compressed variant's schemes, but those a
    variant of no method named "original" measures, in the first compressed variant's settings (the
    defaults when there is none)."""
    compressed = [v for v in run.variants if v.method is not None]
    own = {c.scheme for v in run.variants if v.method is None and v.name == "original" for c in v.quantize.schemes}
    names = [*baselines, *(c.scheme for v in compressed for c in v.quantize.schemes)]
    first = compressed[0].quantize if compressed else QuantizeSpec()
    return first.with_schemes([name for name in dict.fromkeys(names) if name not in own])


def _torch_free(made: Variants, held: list, quantize: QuantizeSpec, frequencies, bench: dict) -> None:
    """The original's rows alone: its graph exported, the model (`held` alone, emptied) let go, the rows manifest
    written (the texts tokenised here: the torch-free stage imports no transformers), and the rows and the bench
    run by the torch-free stage (torch_free.py)."""
    path, schemes = made.export_original(held, quantize, keep=False)
    counts = {c.scheme: head_frequencies(c, frequencies) for c in schemes if c.head_rows}
    inputs = bench_inputs(made.source, bench["texts"][0], bench["second"][0])
    pending = Pending("original", path, schemes, counts)
    round_and_bench(write_manifest(made.rows, pending, {**bench, "inputs": inputs, "argv": list(sys.argv)}))


def measure(run: RunSpec) -> None:
    """The original and every variant side by side in `run.out`, each row in its variant's settings; a run of the
    original's rows alone (no variant, no trained scheme) goes on without the model nor PyTorch once the original
    is exported (torch_free.py)."""
    check_run(run)
    source = resolve_model_dir(run.model)
    kind = kind_for_config(source)
    original_quantize = original_rows(run, kind.baselines)
    check_spec(run, kind, original_quantize)
    original, source = load_original(run.model)
    for variant in run.variants:  # every plan against the model's modules, before the texts are read
        if variant.method is not None:
            check_export_forms(dict(variant.export_forms), original, check_plans(variant.method, original))
    parameters = stored_parameters(source)  # an LM's quality reads fewer passages the bigger it is
    texts, second = eval_texts(run.texts, kind.graph, parameters), second_texts(run.texts, kind.graph, parameters)
    schemes = [*original_quantize.schemes, *(s for variant in run.variants for s in variant.quantize.schemes)]
    schemes = list(dict.fromkeys(schemes))
    batches = quantize_calibration(run.texts, schemes, kind.graph, source)
    fit_for = correction_fit(schemes, run.texts.data, kind, source)
    tuned = any(variant.finetune is not None for variant in run.variants)
    ft_texts = finetune_texts(run.texts.data, kind) if tuned or fit_for is not None else None
    hashes = {"calibration": batches_sha256(batches)} if batches else {}
    if ft_texts is not None:
        hashes["fit"] = texts_sha256([*ft_texts[0], *ft_texts[1]])
    with output_folder(run.out):
        vocab = original.get_input_embeddings().num_embeddings
        frequencies = functools.cache(
            lambda: token_frequencies(run.texts.calib, run.freq_prior, run.prior_weight, source, vocab)
        )
        made = Variants(
            run.out,
            source,
            vocab,
            batches,
            fit_for=fit_for,
            frequencies=frequencies,
            kv_cache=run.kv_cache,
            shortlist=run.shortlist,
        )
        held, keep = [original], bool(run.variants) or any(c.trains for c in original_quantize.schemes)
        model_name = DEFAULT_MODEL_NAME if run.model is None else str(source)
        bench = dict(model_name=model_name, runs=run.runs, goal=run.goal, texts=texts, second=second, hashes=hashes)
        if not keep:
            del original  # `held` holds it alone, emptied once it is exported
            _torch_free(made, held, original_quantize, frequencies, bench)
            return
        made.add_original(held, original_quantize)
        for variant in run.variants:
            if variant.said:
                say(variant.said)
            if variant.method is None:
                made.add_quantized(variant)
            else:
                made.add_compressed(variant, run, original, source, ft_texts)
        made.rows.bench_and_report(**bench)
