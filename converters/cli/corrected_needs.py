"""What the corrected 4-bit schemes (int4-corrected, int4-trained) need on a causal LM: said before any work, and
refused before any where it does not fit. Their cost follows the input Grams more than the weights: each distinct
input of a linear layer has a K × K Gram, summed over the calibration tokens (tokens · K² multiply-adds), held in
float32 to the end, and GPTQ and the corrections' fit work in it. So the estimate goes by Σ K² over those inputs
(a Llama-style layer: its hidden width three times, attention's, its output's and the FFN's, and its FFN width once;
the head's input once more), read from config.json, beside the fp32 weights' bytes for the graphs the scheme holds."""

import json
from pathlib import Path

from compressor.errors import CompressorError
from converters.loading import available_memory, stored_parameters
from converters.quantization.schemes.int4_corrected import Int4CorrectedConfig

__all__ = ["gram_entries", "corrected_needs", "check_corrected_fits", "corrected_said"]

# int4-corrected through `compressor export --quantize int4-corrected` at the default calibration (256 passages) on 2
# cores, avx512_vnni, ONNX Runtime 1.32.0 (BENCHMARKS.md, "LMs at scale"; commit 2aca999, 2026-11-29): SmolLM2-135M
# (Σ K² 101 M) 156 s at a peak of 2.79 GiB, the random Qwen2.5-0.5B shape (494.0 M parameters, Σ K² 626 M) 1,187 s at
# 10.95 GiB. Time grows a little faster than Σ K² (the Grams' sums, GPTQ and the spectra all go by K²; GPTQ and the fits
# by N too): the power through both runs. The peak: the libraries (0.66 GB, the LM run's line: goals.py), the Grams in
# float32 and, from the 0.5B run, 4.35× the fp32 weights for the graphs the scheme holds at once (SmolLM2 then said
# 3.2 GiB).
SECONDS_AT = (1187.4, 626.0e6)  # (seconds, Σ K²) of the 0.5B shape's run
SECONDS_POWER = 1.112  # log(1187.4 / 156.3) / log(626 / 101): SmolLM2's run on the same line
PEAK_BASE_BYTES = 0.66e9
PEAK_PER_FP32_BYTE = 4.35
PEAK_PER_GRAM_ENTRY = 4  # the Grams in float32
# int4-trained holds more: the fp32 PyTorch model kept through the rounding (the teacher), its student (a copy with
# the rounded weights) and the distillation's activations and logits, a few (batch, sequence, V) tensors. The
# validation's logits are made a batch at a time, the best state keeps only the weights that train, the student's
# weights are read as they are taken, each CorrectedLinear's Q ⊙ G is made again in the backward rather than kept, and
# the KL over the vocabulary goes 64 positions at a time. Measured at commit 9ecd31f, 2026-11-30
# (`python benchmarks/large_models.py corrected --only … --scheme int4-trained`): SmolLM2-135M took 474 s at a peak of
# 5.16 GiB, 3.97× its fp32 weights over int4-corrected's estimate, and the 0.5B shape 1,572 s at 17.25 GiB, 3.42× over
# it: the larger taken as the training's, its 240 s beside int4-corrected's time (the 0.5B shape: 24 min said, 26.2
# taken).
TRAINING_PER_FP32_BYTE = 3.97


def gram_entries(model_dir: Path) -> int | None:
    """Σ K² over the distinct inputs of the linear layers of the Llama-style LM in `model_dir` (its config.json's
    widths); None where the config gives none."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        h, i, n = (int(config[key]) for key in ("hidden_size", "intermediate_size", "num_hidden_layers"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return n * (3 * h * h + i * i) + h * h


def corrected_needs(model_dir: Path, trains: bool = False) -> tuple[int, int, int, int] | None:
    """(parameters, Σ K², about how many minutes on 2 cores before any training, the peak resident bytes) of a
    corrected scheme's export of the LM in `model_dir`, one that `trains` (int4-trained) with its training's memory;
    None where its config gives no widths."""
    grams = gram_entries(model_dir)
    if grams is None:
        return None
    params = stored_parameters(Path(model_dir))
    peak = PEAK_BASE_BYTES + PEAK_PER_FP32_BYTE * 4 * params + PEAK_PER_GRAM_ENTRY * grams
    peak += TRAINING_PER_FP32_BYTE * 4 * params if trains else 0
    seconds = SECONDS_AT[0] * (grams / SECONDS_AT[1]) ** SECONDS_POWER
    return params, grams, max(1, round(seconds / 60)), round(peak)


def check_corrected_fits(model_dir: Path, scheme: str, train_seconds: float = 0.0) -> str | None:
    """What `scheme` on the LM in `model_dir` will take, in a sentence (None where its config gives no widths), with
    `train_seconds` of training (int4-trained's --correction-time); refused before any work when its peak exceeds
    what the machine has available."""
    trains = train_seconds > 0
    needs = corrected_needs(model_dir, trains)
    if needs is None:
        return None
    params, grams, minutes, peak = needs
    sizes = f"{params / 1e9:.2f}B parameters, Σ K² {grams / 1e6:.0f} M over the linear layers' inputs"
    free = available_memory()
    if free and peak > free:
        held = f"the graphs at {PEAK_PER_FP32_BYTE:.2f}× the fp32 weights and the input Grams in float32"
        held += f", the training's models at {TRAINING_PER_FP32_BYTE:.2f}× more" if trains else ""
        instead, untrained = "int4-aware, whose peak is the LM run's", corrected_needs(model_dir)[3]
        if trains and untrained <= free:
            instead = f"int4-corrected, whose peak is about {untrained / 2**30:.1f} GiB"
        raise CompressorError(
            f"{scheme} on this LM ({sizes}) needs about {peak / 2**30:.1f} GiB at its peak ({held}) and this machine "
            f"has {free / 2**30:.1f} GiB available: quantize it with {instead}"
        )
    took = f"{minutes + round(train_seconds / 60)} min on 2 cores ({minutes} before its training)" if trains else ""
    took = took or f"{minutes} min on 2 cores"
    return f"{scheme}: about {took} and a peak of about {peak / 2**30:.1f} GiB ({sizes})"


def corrected_said(model_dir: Path, configs) -> list[str]:
    """What each corrected scheme among `configs` (SchemeConfigs of a causal LM's rows) will take on the LM in
    `model_dir`, its training's seconds counted (check_corrected_fits: refused before any work where it does not
    fit)."""
    said = []
    for config in dict.fromkeys(c for c in configs if isinstance(c, Int4CorrectedConfig)):
        seconds = getattr(config, "correction_time", 0.0) if config.trains else 0.0
        needs = check_corrected_fits(model_dir, config.scheme, seconds)
        said += [needs] if needs else []
    return said
