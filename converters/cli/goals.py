"""The goals of `compressor run` (--goal): each the rows a run measures on the user's own model beside original-int8
(what the user would do otherwise) and the rule that picks the row to deploy on the CPU it runs on (eval.choice). A
goal's rows are recipes (converters/cli/builtin_recipes.py, parsed by recipes.py) chosen by what can win by its rule,
measured on MiniLM and a 110M MPNet (docs/lab-notes/2026-11-28-deployment.md):

- balanced (the default): int8-aware, int8-w4 (4-bit weights multiplied in int8: on MiniLM 0.48× int8's file, 0.95×
  its peak RSS, its p50 within the noise, recall 0.07–0.09 short: docs/lab-notes/2026-11-29-int4-in-int8.md) and
  the word table in 3 bits beside int8-aware's products;
- size: int4-aware, the 3-bit table and the 4-bit w4a8 recipe (0.126× on MiniLM, trained 240 s);
- memory: int8-aware, int4-aware and the 3-bit table (the least memory that keeps int8's recall);
- latency: int8-aware (as fast as int8, and the recall smoothing buys);
- quality: int8-aware and the word table in 4 bits (its frequent rows in 8).

w4a8 is measured for size alone: its codes become int8 weights when the session starts, which holds 1.8× int8's
peak memory on MiniLM (2.9× on the MPNet), so by the other goals' rules it cannot win and its minutes are spent
for nothing."""

from pathlib import Path

from compressor.errors import CompressorError
from converters.cli.builtin_recipes import SMALL_RECIPE
from converters.loading import available_memory, stored_parameters
from converters.spec import QUANTIZE_ONLY
from eval.choice import DEFAULT_GOAL, GOALS

__all__ = [
    "GOALS",
    "DEFAULT_GOAL",
    "TABLE_RECIPE",
    "WIDE_TABLE_RECIPE",
    "GOAL_RUNS",
    "GOAL_MINUTES",
    "goal_minutes",
    "goal_said",
    "lm_run_needs",
    "check_lm_run_fits",
]

# int8-aware's products, the word table in 3 bits (its 4,096 most frequent rows in 4, blocks of 32): on MiniLM
# 0.73× int8's file, 0.95× its peak RSS, recall@10 0.931 / 0.924 against int8's 0.906 / 0.915; on the MPNet 0.89×,
# 0.95×, 0.914 / 0.911 (against int4-aware's 0.892 / 0.902 at 1.06× the memory)
TABLE_RECIPE = {
    "name": "original-table3",
    "method": QUANTIZE_ONLY,
    "quantize": ["int8-aware-table"],
    "table_bits": 3,
    "table_head": 4096,
    "table_block": 32,
}
# The same with the table in 4 bits and its frequent rows in 8: MiniLM 0.86× int8's file, recall 0.940 / 0.943
WIDE_TABLE_RECIPE = {**TABLE_RECIPE, "name": "original-table4", "table_bits": 4}


def _rounded(*schemes: str) -> dict:
    return {"method": QUANTIZE_ONLY, "quantize": list(schemes)}


GOAL_RUNS = {
    "balanced": {"variants": [_rounded("int8-aware", "int8-w4"), TABLE_RECIPE]},
    "size": {"variants": [_rounded("int4-aware"), TABLE_RECIPE, SMALL_RECIPE]},
    "memory": {"variants": [_rounded("int8-aware", "int4-aware"), TABLE_RECIPE]},
    "latency": {"variants": [_rounded("int8-aware")]},
    "quality": {"variants": [_rounded("int8-aware"), WIDE_TABLE_RECIPE]},
}


# Each goal's run of MiniLM on 2 cores, about, in minutes (install and the texts' first build aside): size trains
# the w4a8 recipe 240 s
GOAL_MINUTES = {"balanced": 3, "size": 10, "memory": 4, "latency": 3, "quality": 4}
MINILM_WEIGHT_BYTES = 90_868_376  # all-MiniLM-L6-v2's model.safetensors, which GOAL_MINUTES were timed on
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")


def goal_minutes(goal: str, model_dir: Path) -> int:
    """About how many minutes the goal's run takes on 2 cores for the model in `model_dir`: MiniLM's
    (GOAL_MINUTES), times its weights' bytes over MiniLM's (export, calibration and bench read every weight)."""
    weights = sum(p.stat().st_size for pattern in WEIGHT_FILES for p in Path(model_dir).glob(pattern))
    return max(1, round(GOAL_MINUTES[goal] * max(1.0, weights / MINILM_WEIGHT_BYTES)))


def goal_said(goal: str) -> str:
    """What the goal measures and how it picks, in a sentence."""
    rows = []
    for variant in GOAL_RUNS[goal]["variants"]:
        name = variant.get("name", "original")
        rows += [f"{name}-{scheme}" for scheme in variant["quantize"]]
    return f"{', '.join(rows)} beside original-int8; deploy {GOALS[goal]}"


# The original's rows of a causal LM (its kind's baselines: int8, w8, int4 and int4-aware, each graph with its key-value
# cache) and their bench (size, memory, perplexity on two texts, prefill and time per token at contexts 128 and 512) on
# 2 cores, avx512_vnni, ONNX Runtime 1.32.0 (BENCHMARKS.md, "LMs at scale"; `benchmarks/large_models.py lms`), the rows
# and the bench in a process without PyTorch (pipeline/apart.py): SmolLM2-135M (134.5 M parameters) 414 s, peak 1.29 GB
# (commit 9e07439, 2026-11-30); a random Qwen2.5-0.5B shape (494.0 M) 897 s, peak 3.67 GB; a random Llama-3.2-1B shape
# (1,235.8 M) 1,998 s, peak 8.12 GB (commit 67c96ef, 2026-11-30). Time grows with the weights (every stage reads each of
# them a few times) but for the bench's quality, whose passages shrink as the model grows (eval.kinds,
# quality_parameter_passages): about 200 s at any size, the rest the line to the 1B shape's run (SmolLM2's then said
# 7 min, the 0.5B shape's 15: within 5 %). The peak grows with the weights beside what the libraries and the export's
# model hold whatever the size: the line through the two larger runs, 1.50× the fp32 bytes and 0.70 GB, an upper bound
# on SmolLM2's (it says 1.41 GiB, 1.20 taken).
LM_RUN_SECONDS_PER_PARAM = (1998 - 200) / 1235.8e6
LM_RUN_QUALITY_SECONDS = 200
LM_RUN_PEAK_PER_FP32_BYTE = (8.117e9 - 3.666e9) / ((1235.8e6 - 494.0e6) * 4)
LM_RUN_PEAK_BASE_BYTES = 8.117e9 - LM_RUN_PEAK_PER_FP32_BYTE * 1235.8e6 * 4


def lm_run_needs(model_dir: Path) -> tuple[int, int, int]:
    """(parameters, about how many minutes on 2 cores, the peak resident bytes) of the LM run of the model in
    `model_dir`, from the parameters its safetensors headers hold."""
    params = stored_parameters(Path(model_dir))
    peak = LM_RUN_PEAK_BASE_BYTES + params * 4 * LM_RUN_PEAK_PER_FP32_BYTE
    seconds = params * LM_RUN_SECONDS_PER_PARAM + LM_RUN_QUALITY_SECONDS
    return params, max(1, round(seconds / 60)), round(peak)


def check_lm_run_fits(model_dir: Path, rows: tuple[str, ...]) -> str:
    """What the LM run of the model in `model_dir` (its `rows`) will take, in a sentence; refused before any work
    when its peak memory exceeds what the machine has available."""
    params, minutes, peak = lm_run_needs(model_dir)
    free = available_memory()
    rate = f"{LM_RUN_PEAK_BASE_BYTES / 2**30:.1f} GiB and {LM_RUN_PEAK_PER_FP32_BYTE:.1f}× the fp32 weights"
    if free and peak > free:
        fits = (free - LM_RUN_PEAK_BASE_BYTES) / LM_RUN_PEAK_PER_FP32_BYTE / 4 / 1e9
        raise CompressorError(
            f"the original's rows of this LM ({', '.join(rows)}; {params / 1e9:.2f}B parameters, "
            f"{params * 4 / 2**30:.1f} GiB in float32) need about {peak / 2**30:.1f} GiB at their peak ({rate}, "
            f"measured on SmolLM2-135M and Qwen2.5-0.5B's shape) and this machine has {free / 2**30:.1f} GiB "
            f"available: a model of up to {max(fits, 0):.2f}B parameters fits here"
        )
    said = f"about {minutes} minutes on 2 cores and a peak of at most {peak / 2**30:.1f} GiB"
    return f"{said} for {params / 1e9:.2f}B parameters ({rate})"
