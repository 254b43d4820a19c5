"""A causal LM's graphs with an fp32 and an int8 key-value cache (compressor export --kv-cache int8) side by side:
the perplexity of each as a decoder reads text (a first token, then chunks of CHUNK tokens, each attending over
the cache the chunks before it wrote) on the eval text and on a second, unlike one, the top-1 agreement with the
first graph, the time per token at each context (the graphs taking turns, eval.decode_timing.measure_decode), and the
cache's bytes each token reads there.

    python benchmarks/lm_kv_cache.py --ours FOLDER FOLDER [FOLDER …] [--contexts 128 512 2048] [--json OUT]
"""

import argparse
import json
from pathlib import Path

import numpy as np

from decoding.decoders import open_decoder
from eval.decode_timing import DECODE_CONTEXTS, measure_decode
from eval.environment import machine, run_record
from eval.graph import make_session
from eval.kinds import CAUSAL_LM
from eval.probe import PAST, cache_dtype
from files.model_folder import graph_in
from texts.tokens import load_tokenizer

PASSAGES, MAX_TOKENS, CHUNK = 24, 256, 32
THREADS = 2


def stepped_predictions(session, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(−log p(true next token), argmax) at every position after the first of each row, read as a decoder reads:
    the first token alone, then CHUNK tokens a pass over the cache."""
    nll, top = [], []
    for ids in rows:
        decoder = open_decoder(session)
        logits = [decoder.start(np.array(ids[:1]))[None]]
        logits += [decoder.extend(ids[i : i + CHUNK]) for i in range(1, len(ids) - 1, CHUNK)]
        scores = np.concatenate(logits)[: len(ids) - 1].astype(np.float64)
        shifted = scores - scores.max(axis=1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        nll.append(-logp[np.arange(len(logp)), ids[1:]])
        top.append(logp.argmax(axis=1))
    return np.concatenate(nll), np.concatenate(top)


def cache_bytes_per_token(session, context: int) -> int:
    """The bytes of the cache a step at `context` reads: every past, (heads, context, head_dim) each."""
    return sum(
        i.shape[1] * context * i.shape[3] * np.dtype(cache_dtype(i)).itemsize
        for i in session.get_inputs()
        if i.name.startswith(PAST)
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ours", nargs="+", type=Path, required=True, help="model folders; the first is the reference")
    p.add_argument("--contexts", type=int, nargs="+", default=list(DECODE_CONTEXTS), help="context lengths timed")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    tokenizer = load_tokenizer(args.ours[0])
    graphs = [graph_in(f) for f in args.ours]
    sessions = [make_session(g, threads=THREADS) for g in graphs]
    result = {"run": run_record(), "environment": machine(), "quality": {}, "decode": {}}
    for split in ("eval", "second"):
        passages, where = CAUSAL_LM.passages(None, split)
        rows = [ids[:MAX_TOKENS] for t in passages if len(ids := tokenizer(t)["input_ids"]) >= 16][:PASSAGES]
        predictions = [stepped_predictions(s, rows) for s in sessions]
        result["quality"][split] = {"text": where, "passages": len(rows), "tokens": int(len(predictions[0][0]))}
        for folder, (nll, top) in zip(args.ours, predictions):
            result["quality"][split][str(folder)] = {
                "perplexity": round(float(np.exp(nll.mean())), 3),
                "top1_agreement": round(float((top == predictions[0][1]).mean()), 4),
            }
        print(json.dumps(result["quality"][split], indent=1), flush=True)
    passages, _ = CAUSAL_LM.passages(None, "eval")
    stream = np.array([i for t in passages for i in tokenizer(t)["input_ids"]], dtype=np.int64)
    del sessions  # measure_decode makes its own, a turn at a time
    for folder, times in zip(args.ours, measure_decode(graphs, stream, args.contexts, threads=THREADS)):
        session = make_session(graph_in(folder), threads=THREADS)
        for length in args.contexts:
            times[f"ctx{length}"]["cache_mb_read_per_token"] = round(cache_bytes_per_token(session, length) / 1e6, 2)
        result["decode"][str(folder)] = times
    print(json.dumps(result["decode"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
