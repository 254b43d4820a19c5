"""The goals' runs on the command line: each goal's rows (eval.goals: the original's schemes and built-in recipes, by
name) as the recipe file a run makes, what the goal measures in a sentence, and the time and memory said before a
run. Those are read from the committed records of runs (each run's seconds, peak and the CPU's pace just before it,
eval.pace: GOAL_RECORDS, each goal's run on MiniLM; LM_RECORDS, the LMs' runs, `benchmarks/large_models.py lms`;
one file for each CPU they were timed on) and
scaled by what this CPU measures in its first second (its pace now over the record's) and by the model's size: an
encoder goal's time by its weights' bytes over MiniLM's, an LM run's time and peak by the lines through the record's
LM runs (parameters against a row's seconds at the record's pace, times the rows the run measures, and against the
peak), the peak with what the run's processes hold beside its stages on the road it takes, from the shell or from
Python (WAITING_RECORD)."""

import json
import os
from functools import cache
from pathlib import Path

import numpy as np

from compressor.errors import CompressorError
from converters.cli.builtin_recipes import builtin_recipes
from converters.kinds.causal_lm import CausalLMKind
from converters.loading import available_memory, stored_parameters
from converters.pipeline.child import HAND_OVER
from converters.pipeline.rows import SHORTLIST_ROWS
from converters.pipeline.say import say
from converters.quantization.shortlist_head import check_shortlist
from converters.spec import QUANTIZE_ONLY
from eval.environment import integer_path
from eval.goals import DEFAULT_GOAL, GOALS
from eval.pace import cpu_pace

__all__ = [
    "GOALS",
    "DEFAULT_GOAL",
    "GOAL_RECORDS",
    "LM_RECORDS",
    "goal_run",
    "goal_minutes",
    "goal_said",
    "HEAD_SHARE",
    "LM_SHORTLIST",
    "lm_shortlist",
    "default_shortlist",
    "lm_rows",
    "lm_run_needs",
    "check_lm_run_fits",
    "waiting_bytes",
]

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
GOAL_RECORDS = RESULTS / "goals", "minilm-*.json"  # (folder, the files' pattern)
# An LM run's processes together, measured beside its stages' peak, on each road (pipeline/torch_free.py): from
# Python ("child_process") the caller, which exported the original, waits holding the libraries and the modules that
# loading the model imported while the torch-free stage runs; from the shell ("handed_over") the command's process,
# which never loads PyTorch, waits for the export and runs the stage itself
WAITING_RECORD = RESULTS / "house" / "lm-run-peak.json"
LM_RECORDS = RESULTS / "scale", "lms-*.json"
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")
# An LM whose tied head is this share of its weights or more has its w8 and int4 rows measured with a shortlist head
# too, of K tokens (at most a quarter of the vocabulary) from a rank-r fit: on Gemma-3-270M (63 %) a rank-128 fit's
# 1,024 best held the whole head's argmax on 99.8 % / 98.2 % of the tokens of pydoc / news, its 4,096 best on 100 % /
# 99.7 % (benchmarks/results/shortlist/gemma3-270m-recall.json): the 4,096 rows a step gathers cost less than the
# rank-256 fit's twice larger factors (99.8 % of news at 1,024)
HEAD_SHARE = 0.4
LM_SHORTLIST = (4096, 128)


def goal_run(goal: str) -> dict:
    """The recipe file the goal's run makes: the original in the goal's schemes, then its built-in recipes."""
    known = builtin_recipes()
    schemes = GOALS[goal].schemes
    variants = [{"method": QUANTIZE_ONLY, "quantize": list(schemes)}] if schemes else []
    return {"variants": variants + [known[name] for name in GOALS[goal].recipes]}


def goal_said(goal: str) -> str:
    """What the goal measures and how it picks, in a sentence."""
    rows = []
    for variant in goal_run(goal)["variants"]:
        name = variant.get("name", "original")
        rows += [f"{name}-{scheme}" for scheme in variant["quantize"]]
    return f"{', '.join(rows)} beside original-int8; deploy {GOALS[goal].deploys}"


@cache
def _records(records: tuple[Path, str], paced: bool = True) -> list[dict]:
    """The finished runs of the records (folder, pattern), `paced`: those timed with the CPU's pace beside them, and
    of those the runs on this CPU's integer path where there are any (the pace, a float and Python piece, need not
    follow integer kernels with and without VNNI); each with its "name", in the files' order; refused in a sentence
    where the checkout holds none."""
    folder, pattern = records
    runs = [
        {**run, "name": name}
        for path in sorted(folder.glob(pattern))
        for name, run in json.loads(path.read_text(encoding="utf-8")).items()
        if (run.get("pace_s") or not paced) and run.get("exit", 0) == 0
    ]
    if not runs:
        raise CompressorError(f"no record of runs in {folder / pattern}, which the time said before a run is read from")
    here = [run for run in runs if run.get("environment", {}).get("integer_path") == integer_path()]
    return here if paced and here else runs


def _lm_runs(paced: bool = True) -> list[dict]:
    """The LM records' runs (`paced`: those timed with the CPU's pace), each with its peak (its stages' highest)."""
    return [{**run, "peak_bytes": run["stages"]["peak_rss_bytes"]} for run in _records(LM_RECORDS, paced)]


@cache
def _pace() -> float:
    """This CPU's pace now (eval.pace), measured once a process."""
    return cpu_pace()


def _pace_said(ratio: float) -> str:
    return f"this CPU running at {1 / ratio:.2f}× the pace the record was timed at"


def goal_minutes(goal: str, model_dir: Path) -> tuple[int, str]:
    """(about how many minutes the goal's run takes here for the model in `model_dir`, how that was scaled): the
    records' runs of it on MiniLM (their seconds over their pace, the mean), times the model's weights' bytes over
    MiniLM's (export, calibration and bench read every weight), times this CPU's pace now."""
    runs = [run for run in _records(GOAL_RECORDS) if run["name"] == GOALS[goal].estimate]
    if not runs:
        raise CompressorError(
            f"no record of runs holds {GOALS[goal].estimate!r}, the run goal {goal}'s time is read from"
        )
    weights = sum(p.stat().st_size for pattern in WEIGHT_FILES for p in Path(model_dir).glob(pattern))
    scale = max(1.0, weights / runs[0]["weight_bytes"])
    seconds = np.mean([run["seconds"] / run["pace_s"] for run in runs]) * scale * _pace()
    return max(1, round(seconds / 60)), _pace_said(_pace() / np.mean([run["pace_s"] for run in runs]))


def lm_shortlist(model_dir: Path, kind: str, asked: int | None) -> tuple[int, int] | None:
    """(K, rank) of the shortlist head the LM run in `model_dir` measures its w8 and int4 rows with (said), or None:
    `asked` K (0: none), else LM_SHORTLIST where the tied head is HEAD_SHARE of the weights or more; refused in a
    sentence before any work where the model is no LM or the shortlist is out of its range."""
    if asked is not None and kind != "causal-lm":
        raise CompressorError(f"--shortlist is a causal LM's head; {str(model_dir)!r} is a model of the {kind} kind")
    if kind != "causal-lm" or asked == 0:
        return None
    chosen = _shortlist(model_dir, asked)
    if chosen is None:
        return None
    shortlist, rank, share = chosen
    say(
        f"the tied head is {share:.0%} of the weights: w8 and int4 also measured with a shortlist head (its steps "
        f"score exactly the {shortlist} best of a rank-{rank} fit of the head): original-w8-short, original-int4-short"
    )
    return shortlist, rank


def default_shortlist(model_dir: Path) -> tuple[int, int] | None:
    """(K, rank) of the shortlist head an LM run of the model in `model_dir` measures without a --shortlist option,
    or None (lm_shortlist, unsaid)."""
    chosen = _shortlist(model_dir, None)
    return chosen and chosen[:2]


def _shortlist(model_dir: Path, asked: int | None) -> tuple[int, int, float] | None:
    """(K, rank, the tied head's share of the weights) of an LM's shortlist head, `asked` K or by default, or None."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    config = config.get("text_config", config)
    vocab, hidden = config.get("vocab_size"), config.get("hidden_size")
    if not (isinstance(vocab, int) and isinstance(hidden, int)):
        if asked is None:
            return None
        raise CompressorError("--shortlist reads the LM's vocab_size and hidden_size, which its config.json lacks")
    share = vocab * hidden / stored_parameters(Path(model_dir)) if config.get("tie_word_embeddings", True) else 0
    if asked is None and share < HEAD_SHARE:
        return None
    shortlist, rank = asked or min(LM_SHORTLIST[0], vocab // 4), min(LM_SHORTLIST[1], hidden // 2)
    check_shortlist(shortlist, rank, vocab, hidden, None)
    return shortlist, rank, share


def lm_rows(shortlist: tuple[int, int] | None) -> int:
    """The rows an LM run measures: the original, its baselines, and with a `shortlist` head those of SHORTLIST_ROWS
    again."""
    baselines = CausalLMKind.baselines
    return 1 + len(baselines) + (sum(row in SHORTLIST_ROWS for row in baselines) if shortlist else 0)


def _lm_lines() -> tuple[np.ndarray, np.ndarray]:
    """The LM runs' lines: a row's seconds at a pace of 1 s against parameters (least squares over the paced runs;
    through the origin where they are one model's), and the peak against parameters over every run, paced or not
    (memory follows the model, not the CPU's pace), its intercept raised until every run lies on or under it (an upper
    bound). A run's seconds go by its rows: each is rounded and benched, and Gemma-3-270M's seven (two with a
    shortlist head) took as long as Qwen2.5-Coder-0.5B's five; by parameters alone, SmolLM2-135M's run was said at
    1.3× what it took."""
    paced = _lm_runs()
    params = np.array([run["params"] for run in paced], dtype=float)
    seconds = np.array([run["seconds"] / run["pace_s"] / len(run["rows"]) for run in paced])
    time = np.polyfit(params, seconds, 1) if len(set(params)) > 1 else np.array([seconds.mean() / params[0], 0.0])
    runs = [run for run in _lm_runs(paced=False) if run.get("params")]
    sizes = np.array([run["params"] for run in runs], dtype=float)
    peaks = np.array([run["peak_bytes"] for run in runs], dtype=float)
    slope = np.polyfit(sizes, peaks, 1)[0] if len(set(sizes)) > 1 else peaks.max() / sizes[0]
    return time, np.array([slope, max(peaks - slope * sizes)])


def waiting_bytes(handed_over: bool | None = None) -> int:
    """What an LM run's processes hold beside its stages' peak on its road (`handed_over`: from the shell, the torch
    part a child that hands the rest over; else from Python; None: this process's road, child.HAND_OVER): the
    record's run on that road, its processes together less its stages' peak, none below it (WAITING_RECORD)."""
    handed_over = bool(os.environ.get(HAND_OVER)) if handed_over is None else handed_over
    return _waiting("handed_over" if handed_over else "child_process")


@cache
def _waiting(road: str) -> int:
    record = json.loads(WAITING_RECORD.read_text(encoding="utf-8")) if WAITING_RECORD.is_file() else {}
    if road not in record:
        raise CompressorError(
            f"no record of a run's {road} road in {WAITING_RECORD}, which the peak said before an LM run is read from"
        )
    run = record[road]
    return max(round((run["tree_peak_gib"] - run["stage_peak_gib"]) * 2**30), 0)


def lm_run_needs(
    model_dir: Path, shortlist: tuple[int, int] | None, handed_over: bool | None = None
) -> tuple[int, int, int]:
    """(parameters, about how many minutes here at this CPU's pace now, the peak resident bytes at most) of the LM
    run of the model in `model_dir` (its rows with a `shortlist` head or without), from the parameters its safetensors
    headers hold: its rows' time and its stages' peak on the records' lines, and what the run's processes hold beside
    them on its road (waiting_bytes(`handed_over`))."""
    params = stored_parameters(Path(model_dir))
    seconds, peak = _lm_lines()
    minutes = max(1, round(np.polyval(seconds, params) * lm_rows(shortlist) * _pace() / 60))
    return params, minutes, round(np.polyval(peak, params)) + waiting_bytes(handed_over)


def check_lm_run_fits(model_dir: Path, rows: tuple[str, ...], shortlist: tuple[int, int] | None) -> str:
    """What the LM run of the model in `model_dir` (the original's `rows`, and with a `shortlist` head some again)
    will take, in a sentence; refused before any work when its peak memory exceeds what the machine has available."""
    params, minutes, peak = lm_run_needs(model_dir, shortlist)
    free = available_memory()
    runs = _lm_runs()
    models = " and ".join(run["name"] for run in runs)
    ratio = _pace() / np.mean([run["pace_s"] for run in runs])
    if free and peak > free:
        slope, base = _lm_lines()[1]
        raise CompressorError(
            f"the original's rows of this LM ({', '.join(rows)}; {params / 1e9:.2f}B parameters, "
            f"{params * 4 / 2**30:.1f} GiB in float32) need about {peak / 2**30:.1f} GiB at their peak (the line "
            f"through {models}'s runs) and this machine has {free / 2**30:.1f} GiB available: a model of up to "
            f"{max((free - base - waiting_bytes()) / slope, 0) / 1e9:.2f}B parameters fits here"
        )
    waiting = waiting_bytes() / 2**30
    waiting = f", {waiting:.1f} of it its waiting process" if waiting >= 0.05 else ""
    said = f"about {minutes} minutes here and a peak of at most {peak / 2**30:.1f} GiB{waiting}"
    lines = f"{lm_rows(shortlist)} rows on the lines through {models}'s runs"
    return f"{said} for {params / 1e9:.2f}B parameters ({lines}; {_pace_said(ratio)})"
