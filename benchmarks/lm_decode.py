"""A causal LM's cached graph against PyTorch and against recomputing the prefix: greedy parity and the
time per generated token at batch 1.

    python benchmarks/lm_decode.py --pair runs/lm/smollm2 FOLDER [--pair CKPT FOLDER …] [--time FOLDER …]

Each --pair is a model (a Hugging Face directory or a compressed checkpoint) and the model folder its
graph was exported to: 8 prompts (the first 24 tokens of the first 8 passages of the LM eval text),
32 greedy new tokens each, ONNX Runtime's tokens against `transformers`' `generate` on the same
weights. Then the first pair's graph decodes 64 tokens after a 128-token context with its cache and
by reading the whole sequence at every step (what an uncached graph must do), taking turns; and every
graph of --time (the first pair's first) is timed side by side by eval.decode_timing.measure_decode.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from converters.checkpoint import load_model
from decoding.sampling import decode_ids
from eval.decode_timing import decode_times, measure_decode
from eval.graph import make_session
from eval.kinds import CAUSAL_LM
from files.model_folder import graph_in
from texts.tokens import load_tokenizer

PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 8, 24, 32


def prompts(tokenizer) -> list[list[int]]:
    passages, _ = CAUSAL_LM.passages(None, "eval")
    ids = [tokenizer(p)["input_ids"] for p in passages]
    return [i[:PROMPT_TOKENS] for i in ids if len(i) >= PROMPT_TOKENS][:PROMPTS]


def greedy_parity(model_dir: Path, folder: Path, tokenizer) -> dict:
    model, _ = load_model(model_dir)
    session = make_session(graph_in(folder), threads=2)
    eos = model.config.eos_token_id
    same = []
    for prompt in prompts(tokenizer):
        with torch.no_grad():
            theirs = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
        ours = decode_ids(session, np.array(prompt), NEW_TOKENS, eos=eos)
        same.append(ours == theirs[0, len(prompt) :].tolist())
    return {"model": str(model_dir), "graph": str(graph_in(folder)), "identical": f"{sum(same)}/{len(same)}"}


def cache_against_recompute(folder: Path, stream: np.ndarray, rounds: int = 3) -> dict:
    session = make_session(graph_in(folder), threads=2)
    context = np.resize(stream, 128)
    steps = {True: [], False: []}
    for round_ in range(rounds + 1):
        for cached in (True, False):
            times = decode_times(session, context, 64, use_cache=cached)
            if round_:
                steps[cached] += times.step_ms
    p50 = {cached: float(np.percentile(ms, 50)) for cached, ms in steps.items()}
    return {
        "cached_ms": round(p50[True], 2),
        "recomputed_ms": round(p50[False], 2),
        "speedup": round(p50[False] / p50[True], 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", nargs=2, type=Path, action="append", required=True, metavar=("MODEL", "FOLDER"))
    p.add_argument(
        "--time", nargs="*", type=Path, default=[], help="more model folders to time beside the first pair's"
    )
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(2)
    tokenizer = load_tokenizer(args.pair[0][0])
    passages, _ = CAUSAL_LM.passages(None, "eval")
    stream = np.array([i for t in passages for i in tokenizer(t)["input_ids"]], dtype=np.int64)
    result = {"greedy": [greedy_parity(m, f, tokenizer) for m, f in args.pair]}
    print(json.dumps(result["greedy"], indent=1), flush=True)
    result["cache"] = cache_against_recompute(args.pair[0][1], stream)
    print(json.dumps(result["cache"]), flush=True)
    folders = [args.pair[0][1], *args.time]
    timed = measure_decode([graph_in(f) for f in folders], stream)
    result["decode"] = {str(f): t for f, t in zip(folders, timed)}
    print(json.dumps(result["decode"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
