"""The calibration steps: the calibration text, the statistics pass said before it starts (passages,
layers, the statistics' size, the time from its first batch) and after, and the quantizer's ranges."""

import dataclasses
import time
from pathlib import Path

import numpy as np
from torch import nn

from compressor.errors import CompressorError
from converters.calibration import (
    Calibration,
    cached_calibration,
    default_cache_dir,
    statistics_bytes,
    token_counts,
)
from converters.kinds import kind_for_config, kind_of
from converters.loading import available_memory
from converters.pipeline.say import say
from converters.spec import MethodSpec, TextSpec
from texts.prior import prior_for, prior_said
from texts.tokens import encode_passages, load_tokenizer

__all__ = ["quantize_calibration", "calibration", "token_frequencies", "head_frequencies"]


def quantize_calibration(texts: TextSpec, schemes, kind_graph, source: Path) -> list[dict] | None:
    """The graph's input batches of the calibration text, when `schemes` (configs) holds any: the aware schemes
    calibrate on them, and every quantized graph is judged against its fp32 graph on them (text, not
    random ids: random ids make activations no text makes)."""
    if not schemes:
        return None
    passages, where = kind_graph.passages(texts.calib, "calib")
    passages = passages[: kind_graph.calibration_passages]
    aware = ", ".join(dict.fromkeys(config.scheme for config in schemes if config.calibrated))
    if aware:
        say(f"{aware}: activation ranges from {len(passages)} passages of {where}")
    return encode_passages(load_tokenizer(source), passages)


def calibration(
    text: TextSpec, spec: MethodSpec, model: nn.Module, source: Path, linear: list[str], sensitivity: bool
) -> Calibration:
    """The statistics of the `linear` layers (with output sensitivities if asked) on at most
    calib_passages of the calibration text, cached unless no_cache; the token counts of all of its
    passages, blended with the spec's prior."""
    every, where = kind_of(model).graph.passages(text.calib, "calib")
    texts = every[: text.calib_passages]
    _check_statistics_fit(model, linear, sensitivity)
    tokenizer = load_tokenizer(source)
    blended = spec.freq_prior != "none" and spec.prior_weight > 0
    vocab = model.get_input_embeddings().num_embeddings
    prior = prior_for(spec.freq_prior, tokenizer, vocab) if blended else None  # a bad saved prior fails now
    start = time.perf_counter()
    cache = None if text.no_cache else default_cache_dir()
    say(
        f"calibrating on {len(texts)} passages, {len(linear)} linear layer(s)"
        f"{', with output sensitivities' if sensitivity else ''}: "
        f"statistics of at most {_in_mib_or_gib(statistics_bytes(model, linear, sensitivity))}"
    )
    calib = cached_calibration(
        cache, model, tokenizer, texts, linear, sensitivity=sensitivity, on_estimate=_say_estimate("calibration")
    )
    cached = "not cached" if cache is None else f"cache: {cache}"
    say(
        f"calibration: {len(texts)} passages from {where}, {calib.tokens:,} tokens, "
        f"{len(linear)} linear layer(s), {time.perf_counter() - start:.1f} s ({cached})"
    )
    calib = dataclasses.replace(calib, counts=token_counts(tokenizer, every, calib.counts.numel()))
    say(f"token counts: all {len(every):,} passages of the calibration text, {calib.tokens:,} tokens")
    if prior is None:
        return calib
    seen = int((calib.counts > 0).sum())
    say(
        f"token frequencies: the calibration counts ({seen:,} distinct tokens) blended with "
        f"{prior_said(spec.freq_prior)} ({int((prior > 0).sum()):,} tokens) at weight {spec.prior_weight:g}"
    )
    return calib.with_prior(prior, spec.prior_weight)


def token_frequencies(
    calib: Path | None, freq_prior: str, prior_weight: float, source: Path, vocab: int
) -> Calibration:
    """The token counts of every passage of the calibration text `calib` (None: the default), blended
    with the prior (`freq_prior` at `prior_weight`) as the data-aware methods blend them: what ranks
    tokens for an export form that caches the most frequent ones."""
    tokenizer = load_tokenizer(source)
    texts, where = kind_for_config(source).graph.passages(calib, "calib")
    counts = Calibration({}, token_counts(tokenizer, texts, vocab), tuple(tokenizer.all_special_ids))
    say(f"token counts: every passage of {where}, {counts.tokens:,} tokens")
    if freq_prior == "none" or prior_weight == 0:
        return counts
    say(f"token frequencies: blended with {prior_said(freq_prior)} at weight {prior_weight:g}")
    return counts.with_prior(prior_for(freq_prior, tokenizer, vocab), prior_weight)


def _in_mib_or_gib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size < 2**30 else f"{size / 2**30:.2f} GiB"


def _say_estimate(what: str):
    return lambda seconds: say(f"{what}: about {seconds:.0f} s (from the first batch)")


def _check_statistics_fit(model: nn.Module, linear: list[str], sensitivity: bool) -> None:
    """The calibration statistics fit in the memory left, said before the pass starts."""
    need, free = statistics_bytes(model, linear, sensitivity), available_memory()
    if free and need > free:
        lighter = "--fit aware (no output sensitivities), " if sensitivity else ""
        raise CompressorError(
            f"the calibration statistics of {len(linear)} linear layer(s) need up to {need / 2**30:.1f} GiB and "
            f"{free / 2**30:.1f} GiB are available: use {lighter}fewer --targets or --fit plain"
        )


def head_frequencies(config, frequencies) -> np.ndarray | None:
    """What ranks the word table's rows a scheme's `config` keeps wider (its head_rows): the counts (V,) of
    `frequencies` (a cached token_frequencies), the whole calibration text blended with the prior, so that a head
    of thousands of rows is not ranked by the few passages the quantizers calibrate on (BENCHMARKS.md, "The tied
    head by frequency"); None where it keeps no head."""
    return frequencies().counts.numpy() if config.head_rows else None
