"""The calibration steps: the calibration text, the statistics pass said before it starts (passages,
layers, the statistics' size, the time from its first batch) and after, and the quantizer's ranges."""

import dataclasses
import time
from pathlib import Path

from torch import nn

from compressor.errors import CompressorError
from converters.calibration import (
    Calibration,
    cached_calibration,
    default_cache_dir,
    statistics_bytes,
    token_counts,
)
from converters.cli.say import say
from converters.kinds import kind_of
from converters.loading import available_memory
from converters.quantization.quantize import CALIBRATED, CALIBRATION_PASSAGES
from texts.prior import token_prior
from texts.tokens import encode_passages, load_tokenizer

__all__ = ["quantize_calibration", "calibration"]


def _all_calib_texts(args, kind_graph) -> tuple[list[str], str]:
    """Every passage of --calib (or the kind's default calib split), and where they come from."""
    if args.calib_passages < 1:
        raise CompressorError(f"--calib-passages must be at least 1, got {args.calib_passages}")
    return kind_graph.passages(args.calib, "calib")


def _calib_texts(args, kind_graph, most: int | None = None) -> tuple[list[str], str]:
    """The passages of --calib (or the kind's default calib split), cut to `most` (default: --calib-passages)."""
    texts, where = _all_calib_texts(args, kind_graph)
    return texts[: most or args.calib_passages], where


def quantize_calibration(args, schemes: list[str], kind_graph, source: Path) -> list[dict] | None:
    """The graph's input batches of the calibration text, when `schemes` holds any: the aware schemes
    calibrate on them, and every quantized graph is judged against its fp32 graph on them (text, not
    random ids: random ids make activations no text makes)."""
    if not schemes:
        return None
    texts, where = _calib_texts(args, kind_graph, CALIBRATION_PASSAGES)
    aware = ", ".join(s for s in schemes if s in CALIBRATED)
    if aware:
        say(f"{aware}: activation ranges from {len(texts)} passages of {where}")
    return encode_passages(load_tokenizer(source), texts)


def calibration(args, model: nn.Module, source: Path, linear: list[str], sensitivity: bool) -> Calibration:
    every, where = _all_calib_texts(args, kind_of(model).graph)
    texts = every[: args.calib_passages]
    _check_statistics_fit(model, linear, sensitivity)
    start = time.perf_counter()
    cache = None if args.no_cache else default_cache_dir()
    tokenizer = load_tokenizer(source)
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
    if args.freq_prior == "none" or args.prior_weight == 0:
        return calib
    prior = token_prior(tokenizer, calib.counts.numel())
    seen = int((calib.counts > 0).sum())
    say(
        f"token frequencies: the calibration counts ({seen:,} distinct tokens) blended with {args.freq_prior}'s "
        f"English word frequencies ({int((prior > 0).sum()):,} tokens) at weight {args.prior_weight:g}"
    )
    return calib.with_prior(prior, args.prior_weight)


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
