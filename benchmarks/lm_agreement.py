"""How often LM graphs agree with the first (the fp32 graph) on the next token, with their perplexity and KL, on
the LM's eval text and the second text (the first passages of each), one graph held at a time.

    python benchmarks/lm_agreement.py FP32_FOLDER FOLDER [FOLDER …] [--passages 40] [--json OUT]
"""

import argparse
import json
from pathlib import Path

from converters.pipeline.steps import eval_texts, second_texts
from converters.spec import TextSpec
from eval.benchmark import bench_inputs
from eval.environment import machine, run_record
from eval.graph import numbers_session
from eval.kinds import CAUSAL_LM
from files.model_folder import graph_in


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", type=Path, nargs="+", help="model folders; the first is the reference")
    p.add_argument("--passages", type=int, default=40, help="passages of each text (default: 40)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    spec = TextSpec()
    first, _ = eval_texts(spec, CAUSAL_LM)
    second, _ = second_texts(spec, CAUSAL_LM)
    inputs = bench_inputs(args.folders[0], first[: args.passages], second[: args.passages])
    references, rows = {}, {}
    for folder in args.folders:
        session = numbers_session(graph_in(folder))
        rows[str(folder)] = {}
        for key, encoded in inputs.batches.items():
            represented = CAUSAL_LM.represent(session, encoded, references.get(key))
            rows[str(folder)][key] = CAUSAL_LM.quality(references.setdefault(key, represented), represented)
        del session
        print(folder, json.dumps(rows[str(folder)]), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        result = {"run": run_record(), "environment": machine(), "passages": args.passages, "quality": rows}
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
