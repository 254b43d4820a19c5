"""llama.cpp's greedy decoding of a GGUF file, served to benchmarks/lm_against_genai.py over a pipe: run by
an interpreter that has llama-cpp-python (not a dependency of the project: `python -m venv V && V/bin/pip
install llama-cpp-python`, which builds llama.cpp for this CPU), one JSON request a line on stdin,
{"context": [token ids], "steps": N}, answered by one line {"prefill_ms", "step_ms", "tokens"}: the
prefill of the context, then N greedy steps of one token each, each step's evaluation timed (the argmax
that picks its token is not, as eval.decode_timing.decode_times times ours); tokens: the N + 1 picked.

    V/bin/python benchmarks/llamacpp_decode.py MODEL.gguf --threads 2"""

import argparse
import json
import sys
import time

import numpy as np
from llama_cpp import Llama


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gguf")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--context", type=int, default=1024)
    args = p.parse_args()
    llm = Llama(
        model_path=args.gguf,
        n_ctx=args.context,
        n_batch=512,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
    )
    vocab = llm.n_vocab()

    def picked() -> int:
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        llm.reset()
        start = time.perf_counter()
        llm.eval(request["context"])
        prefill = (time.perf_counter() - start) * 1e3
        tokens, steps = [picked()], []
        for _ in range(request["steps"]):
            start = time.perf_counter()
            llm.eval([tokens[-1]])
            steps.append((time.perf_counter() - start) * 1e3)
            tokens.append(picked())
        print(json.dumps({"prefill_ms": prefill, "step_ms": steps, "tokens": tokens}), flush=True)


if __name__ == "__main__":
    main()
