"""Our cached LM graphs against ONNX Runtime GenAI's (its model builder's graph, run by its own
generator) and llama.cpp's (a GGUF file): the time per generated token at batch 1, taking turns, and the
greedy tokens against the fp32 graph's.

    python benchmarks/lm_against_genai.py --ours FOLDER [FOLDER …] [--genai FOLDER …]
        [--gguf FILE --llama-python V/bin/python] [--draft lookup|FOLDER … --draft-tokens K]
        [--contexts 128 512 2048] [--json OUT]

With --draft, the last of --ours is also decoded speculatively with each draft (decoding.speculative), a row of
its own: its greedy tokens against that graph's own stepwise ones too, the drafts' acceptance, tokens per
pass of the verifier and weight bytes read per token (the verifier's per pass and the draft's per proposal,
over the tokens they yield).

The first of --ours is the reference of the greedy comparison (the fp32 graph). onnxruntime-genai is
not a dependency of the project: install it beside (`pip install --target DIR onnxruntime-genai
--no-deps`, then PYTHONPATH=DIR) and build its folder with `python -m onnxruntime_genai.models.builder
-i runs/lm/smollm2 -o GENAI_FOLDER -p int4 -e cpu`; a fused decoder's folder of ours holds a
genai_config.json (files.genai_config), so --genai runs it by GenAI's generator too. Contexts are the
first tokens of the LM eval text; each graph takes one prefill and DECODE_TOKENS steps in turn, the first
round a warm-up; each round's mean is kept, so that a ratio to GenAI reads against its rounds' spread.
llama.cpp runs in its own interpreter (benchmarks/llamacpp_decode.py says how to make one), fed the same
token ids over a pipe."""

import argparse
import json
import subprocess
import time
from pathlib import Path

import numpy as np

from converters.quantization.shortlist_head import step_weight_bytes
from decoding.drafts import LOOKUP, open_draft
from decoding.sampling import decode_ids
from decoding.speculative import DRAFT_TOKENS, SpeculativeStats, speculative_ids
from eval.decode_timing import (
    DECODE_CONTEXTS,
    DECODE_ROUNDS,
    DECODE_TOKENS,
    DecodeTimes,
    decode_times,
    speculative_times,
)
from eval.environment import machine, run_record
from eval.graph import initializer_stats, load_graph, make_session
from eval.kinds import CAUSAL_LM
from eval.probe import peak_rss_bytes
from files.model_folder import graph_in
from texts.tokens import load_tokenizer

PROMPTS, PROMPT_TOKENS, GREEDY_TOKENS = 8, 24, 64
THREADS = 2


def genai_model(folder: Path):
    import onnxruntime_genai as og

    config = og.Config(str(folder))
    options = {"intra_op_num_threads": THREADS, "inter_op_num_threads": 1}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    return og.Model(config)


def genai_run(model, context: np.ndarray, new_tokens: int) -> tuple[DecodeTimes, list[int]]:
    """GenAI's greedy decoding of `new_tokens` after `context`: its times and the new tokens."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(context) + new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    start = time.perf_counter()
    generator.append_tokens(np.asarray(context, dtype=np.int32))
    prefill = (time.perf_counter() - start) * 1e3
    steps = []
    while not generator.is_done() and len(steps) < new_tokens:
        start = time.perf_counter()
        generator.generate_next_token()
        steps.append((time.perf_counter() - start) * 1e3)
    return DecodeTimes(prefill, steps), list(generator.get_sequence(0))[len(context) :]


class LlamaCpp:
    """llama.cpp's decoding of `gguf`, in the interpreter `python` (benchmarks/llamacpp_decode.py)."""

    def __init__(self, python: Path, gguf: Path, context: int):
        worker = Path(__file__).with_name("llamacpp_decode.py")
        command = [str(python), str(worker), str(gguf), "--threads", str(THREADS), "--context", str(context)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        json.loads(self.process.stdout.readline())  # {"ready": true} once the model is loaded

    def run(self, context: np.ndarray, steps: int) -> tuple[DecodeTimes, list[int]]:
        """Its prefill of `context` and `steps` greedy steps: their times, and the steps + 1 tokens picked."""
        self.process.stdin.write(json.dumps({"context": [int(i) for i in context], "steps": steps}) + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline())
        return DecodeTimes(answer["prefill_ms"], answer["step_ms"]), answer["tokens"]


def weight_bytes(folder: Path) -> int:
    """The bytes of the weights one decoding step of the graph in `folder` reads: all of them, but the K of V rows of
    the head that a shortlist head reads (shortlist_head.step_weight_bytes)."""
    model = load_graph(graph_in(folder), with_data=False)
    return step_weight_bytes(model, initializer_stats(model)[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ours", nargs="+", type=Path, required=True, help="model folders; the first is fp32")
    p.add_argument(
        "--genai",
        type=Path,
        nargs="+",
        default=[],
        help="folders run by onnxruntime-genai's generator: its model builder's, or ours with genai_config.json",
    )
    p.add_argument("--gguf", type=Path, nargs="+", default=[], help="GGUF files run by llama.cpp")
    p.add_argument("--llama-python", type=Path, default=None, help="an interpreter with llama-cpp-python")
    p.add_argument(
        "--draft", nargs="+", default=[], help=f"'{LOOKUP}' or draft LM folders: the last --ours decoded with each"
    )
    p.add_argument("--draft-tokens", type=int, default=DRAFT_TOKENS, help="proposals per verifier pass, at most")
    p.add_argument(
        "--fixed", action="store_true", help="always --draft-tokens proposals: a draft's acceptance, whatever it costs"
    )
    p.add_argument("--contexts", type=int, nargs="+", default=list(DECODE_CONTEXTS), help="context lengths timed")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.gguf and args.llama_python is None:
        p.error("--gguf runs in an interpreter with llama-cpp-python: give it with --llama-python")
    for gguf in args.gguf:
        if not gguf.is_file():
            p.error(f"{str(gguf)!r} is not a file")
    tokenizer = load_tokenizer(args.ours[0])
    verifier = str(args.ours[-1])
    drafts = {f"{verifier}+draft:{Path(d).name}": d for d in args.draft}
    drafts = {
        name: open_draft(d, graph_in(Path(verifier)), tokenizer, args.draft_tokens, THREADS)
        for name, d in drafts.items()
    }
    passages, _ = CAUSAL_LM.passages(None, "eval")
    stream = np.array([i for t in passages for i in tokenizer(t)["input_ids"]], dtype=np.int64)
    sessions = {str(f): make_session(graph_in(f), threads=THREADS) for f in args.ours}
    models = {f"genai:{f}": genai_model(f) for f in args.genai}
    llamas = {
        f"llama.cpp:{f.name}": LlamaCpp(args.llama_python, f, max(args.contexts) + DECODE_TOKENS + 1) for f in args.gguf
    }
    names = [*sessions, *drafts, *models, *llamas]

    prompts = [ids[:PROMPT_TOKENS] for t in passages if len(ids := tokenizer(t)["input_ids"]) >= PROMPT_TOKENS]
    greedy = {name: [] for name in names}
    for prompt in prompts[:PROMPTS]:
        for name, session in sessions.items():
            greedy[name].append(decode_ids(session, np.array(prompt), GREEDY_TOKENS))
        for name, draft in drafts.items():
            ids = speculative_ids(
                sessions[verifier], draft, np.array(prompt), GREEDY_TOKENS, args.draft_tokens, adaptive=not args.fixed
            )[0]
            greedy[name].append(ids)
        for name, model in models.items():
            greedy[name].append(genai_run(model, np.array(prompt), GREEDY_TOKENS)[1])
        for name, llama in llamas.items():
            greedy[name].append(llama.run(np.array(prompt), GREEDY_TOKENS - 1)[1])
    result = {"run": run_record(), "environment": machine(), "greedy": {}, "decode": {name: {} for name in names}}
    for name in names:
        references = {"first": greedy[names[0]]}  # the first of --ours: the fp32 graph where given
        if name in drafts:
            references["verifier"] = greedy[verifier]
        result["greedy"][name] = {}
        for against, reference in references.items():
            same = [a == b for a, b in zip(greedy[name], reference)]
            first = [
                next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), len(b))
                for a, b in zip(greedy[name], reference)
            ]
            result["greedy"][name][against] = {
                "identical": f"{sum(same)}/{len(same)}",
                "mean_tokens_before_first_difference": float(np.mean(first)),
            }
    print(json.dumps(result["greedy"], indent=1), flush=True)

    weights = {verifier: weight_bytes(Path(verifier))}
    weights.update({name: weight_bytes(Path(d)) for name, d in zip(drafts, args.draft) if d != LOOKUP})
    for length in args.contexts:
        context = np.resize(stream, length)
        kept = {name: [] for name in names}
        stats = {name: SpeculativeStats() for name in drafts}
        for round_ in range(DECODE_ROUNDS + 1):
            for name in names:
                if name in models:
                    times = genai_run(models[name], context, DECODE_TOKENS)[0]
                elif name in llamas:
                    times = llamas[name].run(context, DECODE_TOKENS)[0]
                elif name in drafts:
                    times, measured = speculative_times(
                        sessions[verifier], drafts[name], context, DECODE_TOKENS, args.draft_tokens, not args.fixed
                    )
                    if round_:
                        stats[name].add(measured)
                else:
                    times = decode_times(sessions[name], context, DECODE_TOKENS)
                if round_:
                    kept[name].append(times)
        for name in names:
            steps = [ms for t in kept[name] for ms in t.step_ms]
            prefill = float(np.median([t.prefill_ms for t in kept[name]]))
            result["decode"][name][f"ctx{length}"] = DecodeTimes(prefill, steps).summary()
            # each round's mean: the rows took turns, so a ratio's rounds pair up and give its spread
            result["decode"][name][f"ctx{length}"]["round_mean_ms"] = [
                round(float(np.mean(t.step_ms)), 3) for t in kept[name]
            ]
        for name, measured in stats.items():
            tokens = sum(measured.pass_tokens)
            read = weights[verifier] * len(measured.pass_tokens) + weights.get(name, 0) * measured.proposed
            result["decode"][name][f"ctx{length}"].update(
                measured.summary(), weight_mb_read_per_token=round(read / tokens / 1e6, 2)
            )
    result["peak_rss_gib"] = round(peak_rss_bytes() / 2**30, 2)  # the whole process: every row's sessions at once
    print(json.dumps(result["decode"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
