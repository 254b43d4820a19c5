"""The time and peak memory of each goal's run on the default model, with the CPU's pace just before it: the record
the time said before a goal's run is read from (converters/cli/goals.py: scaled by the pace a run measures in its
first second over the record's, and by the model's weights over MiniLM's).

    python benchmarks/goal_times.py --out runs/goals [--goals balanced latency] \
        --json benchmarks/results/goals/minilm-avx512_vnni.json

Each `compressor run --goal GOAL` runs in a process of its own (its peak: wait4's, the process and what it waited
for); the record gains or replaces one entry a goal, "all-MiniLM-L6-v2 GOAL"."""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from converters.loading import default_model_path
from eval.environment import machine, run_record
from eval.goals import GOALS
from eval.pace import cpu_pace
from files.atomic import atomic_file

MODEL = "all-MiniLM-L6-v2"


def time_goal(goal: str, out: Path) -> dict:
    """One run of `goal` on the default model into `out`: its wall seconds, peak RSS and the pace before it."""
    pace = cpu_pace()
    argv = [sys.executable, "-m", "converters.cli", "run", "--goal", goal, "--out", str(out)]
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed (exit {os.waitstatus_to_exitcode(status)})")
    weights = sum(p.stat().st_size for p in default_model_path().glob("*.safetensors"))
    return {
        "model": MODEL,
        "command": f"compressor run --goal {goal} --out {out}",
        "seconds": round(seconds, 1),
        "pace_s": pace,
        "weight_bytes": weights,
        "peak_rss_bytes": usage.ru_maxrss * 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/goals"))
    p.add_argument("--goals", nargs="+", default=list(GOALS), choices=list(GOALS))
    p.add_argument("--json", type=Path, required=True, help="the record to add each goal's entry to")
    args = p.parse_args()
    record = json.loads(args.json.read_text()) if args.json.is_file() else {}
    for goal in args.goals:
        entry = time_goal(goal, args.out / goal)
        entry.update(run=run_record(["benchmarks/goal_times.py", *sys.argv[1:]]), environment=machine())
        record[f"{MODEL} {goal}"] = entry
        print(f"{goal:9} {entry['seconds']:7.1f} s  pace {entry['pace_s']:.3f} s", flush=True)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(args.json) as tmp:
            tmp.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
