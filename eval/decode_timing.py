"""What decoding costs per token, as a user runs it (decoding.decoders, at batch 1): the prefill of a context, then
each greedy step, timed; the graphs of a bench take turns (measure_decode), and a speculative decoding's passes are
timed as the tokens they yield (speculative_times)."""

import time
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from decoding.decoders import open_decoder
from decoding.lookahead import Lookahead
from decoding.speculative import DRAFT_TOKENS, SpeculativeStats, speculate
from eval.graph import make_session, runtime_errors
from eval.memory import trim_heap

__all__ = [
    "DecodeTimes",
    "decode_times",
    "measure_decode",
    "speculative_times",
    "DECODE_CONTEXTS",
    "DECODE_ROUNDS",
    "DECODE_TOKENS",
]

DECODE_CONTEXTS = (128, 512)  # tokens of context before the timed steps
DECODE_TOKENS = 32  # greedy steps timed after each context, per round
DECODE_ROUNDS = 3  # rounds in which the graphs take turns


@dataclass(frozen=True)
class DecodeTimes:
    prefill_ms: float  # reading the context
    step_ms: list[float]  # each greedy step after it

    def summary(self) -> dict:
        steps = np.array(self.step_ms)
        return {
            "prefill_ms": round(self.prefill_ms, 3),
            "per_token_p50_ms": round(float(np.percentile(steps, 50)), 3),
            "per_token_p90_ms": round(float(np.percentile(steps, 90)), 3),
            "tokens_per_s": round(1e3 / float(np.mean(steps)), 2),
        }


def decode_times(
    session, context: np.ndarray, new_tokens: int, use_cache: bool = True, shrink: bool = False
) -> DecodeTimes:
    """The prefill of `context` (1-D ids) and `new_tokens` greedy steps after it, each timed (`shrink`: the
    prefill's activations given back at its end, within its time: decoding.decoders)."""
    decoder = open_decoder(session, use_cache, shrink)
    start = time.perf_counter()
    logits = decoder.start(context)
    prefill = (time.perf_counter() - start) * 1e3
    steps = []
    for _ in range(new_tokens):
        token = int(np.argmax(logits))
        start = time.perf_counter()
        logits = decoder.step(token)
        steps.append((time.perf_counter() - start) * 1e3)
    return DecodeTimes(prefill, steps)


def measure_decode(
    paths,
    stream: np.ndarray,
    contexts=DECODE_CONTEXTS,
    new_tokens: int = DECODE_TOKENS,
    rounds: int = DECODE_ROUNDS,
    threads: int = 2,
    progress: bool = True,
) -> list[dict]:
    """Per graph, at batch 1 and each context length (the first tokens of `stream`, repeated when
    shorter): {"ctx128": {prefill_ms, per_token_p50_ms, per_token_p90_ms, tokens_per_s}, …}, or {"failed": what
    ONNX Runtime said} for a graph it could not decode. The graphs take turns, one prefill and `new_tokens` steps
    each, for `rounds` rounds; the first round is a warm-up, and the time per token is over every step of the
    others. Each turn makes its graph's session and lets it go after (`_turn`): one session is held at a time, so
    a bench's peak is its largest graph's, not two's (Gemma-3-270M's fp32 graph held 1.8 GiB with its packed weights,
    a row's 0.8 beside it)."""
    kept: list[dict[int, list[DecodeTimes]]] = [{length: [] for length in contexts} for _ in paths]
    failed: dict[int, str] = {}  # graph index → what ONNX Runtime said when it could not decode it
    bar = tqdm(
        total=len(contexts) * (rounds + 1) * len(paths), desc="decode: prefill and time per token", disable=not progress
    )
    for length in contexts:
        context = np.resize(stream, length)
        for round_ in range(rounds + 1):
            for i, path in enumerate(paths):
                if i in failed:
                    continue
                measured = _turn(path, context, new_tokens, threads)
                bar.update()
                if isinstance(measured, str):
                    failed[i] = measured
                elif round_:
                    kept[i][length].append(measured)
    bar.close()
    return [
        {"failed": failed[i]} if i in failed else {f"ctx{n}": _pooled(turns).summary() for n, turns in times.items()}
        for i, times in enumerate(kept)
    ]


def _turn(path, context: np.ndarray, new_tokens: int, threads: int) -> DecodeTimes | str:
    """The graph at `path` decoding `context` and `new_tokens` steps in a session of its own, made (not timed) and
    let go with what it freed given back; where ONNX Runtime fails, what it said, in a sentence."""
    session = make_session(path, threads=threads)
    try:
        return decode_times(session, context, new_tokens, shrink=True)
    except runtime_errors() as error:
        return f"decoding after {len(context)} tokens of context failed: {_first_line(error)}"
    finally:
        del session
        trim_heap()


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _pooled(turns: list[DecodeTimes]) -> DecodeTimes:
    """The median prefill of `turns` and every step of them."""
    return DecodeTimes(float(np.median([t.prefill_ms for t in turns])), [ms for t in turns for ms in t.step_ms])


def speculative_times(
    verifier_session, draft, context: np.ndarray, new_tokens: int, k: int = DRAFT_TOKENS, adaptive: bool = True
) -> tuple[DecodeTimes, SpeculativeStats]:
    """The prefill of `context` by the verifier and the draft (decoding.drafts), and `new_tokens` tokens after it
    (decoding.speculative): a verifier pass of t ms (the draft's proposals before it included) yielding n tokens
    counts n steps of t / n ms; `adaptive` False: k proposals a pass (what the draft guesses, whatever it costs)."""
    verifier = open_decoder(verifier_session)
    start = time.perf_counter()
    logits = verifier.start(context)
    draft.start(context)
    prefill = (time.perf_counter() - start) * 1e3
    steps: list[float] = []
    clock = [time.perf_counter()]

    def timed(tokens: int) -> None:
        now = time.perf_counter()
        steps.extend([(now - clock[0]) * 1e3 / tokens] * tokens)
        clock[0] = now

    _, stats = speculate(verifier, draft, logits, new_tokens + 1, Lookahead(k, draft.cost, adaptive), None, timed)
    return DecodeTimes(prefill, steps[:new_tokens]), stats
