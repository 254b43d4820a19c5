"""Decoding with an ONNX causal LM on ONNX Runtime, as a user runs it, and what it costs per token.
A graph with a key-value cache (eval.probe.PAST) reads the prompt once (the prefill), then each new
token is one step fed the presents of the last; a graph without one reads the whole sequence again
at every step. Greedy, or sampling from softmax(logits / temperature) over the top k, seeded."""

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from compressor.errors import CompressorError
from eval.graph import make_session, runtime_errors
from eval.memory import trim_heap
from eval.probe import CACHE_TYPES, PAST, PRESENT, cache_dtype, full_feed, is_cached

__all__ = [
    "Decoder",
    "DecodeTimes",
    "decode_ids",
    "decode_times",
    "measure_decode",
    "DECODE_CONTEXTS",
    "DECODE_TOKENS",
    "context_length",
]

DECODE_CONTEXTS = (128, 512)  # tokens of context before the timed steps
DECODE_TOKENS = 32  # greedy steps timed after each context, per round
DECODE_ROUNDS = 3  # rounds in which the graphs take turns
SHARED_START = 256  # tokens of room past the prompt in a shared cache's first buffers


class Decoder:
    """One sequence (batch 1) through a causal LM session: `start(prompt)` and `step(token)` give the
    logits (V,) of the next token. A graph whose positions come from the mask (GroupQueryAttention's:
    the fused decoder's, GenAI's) gets its pasts as buffers it writes each step's keys and values into,
    bound in place (ONNX Runtime's I/O binding), as GenAI's own loop does; other cached graphs are fed
    the presents they returned."""

    def __init__(self, session, use_cache: bool = True, shrink: bool = False):
        """`use_cache` False: a cached graph too reads the whole sequence at every step (pasts empty),
        as a graph without a cache must; `shrink`: the session's memory arena given back what a prompt's pass
        took, at its end (sessions that take turns would each keep their prompt's activations: a 0.5B LM's
        logits alone are 311 MB at 512 tokens)."""
        self.session = session
        self.prompt_options = _shrinking() if shrink else None
        self.cached = use_cache and is_cached(session)
        self.outputs = [o.name for o in session.get_outputs()]
        logits = next(o for o in session.get_outputs() if o.name == "logits")
        self.logits_type = (logits.shape[-1], CACHE_TYPES.get(logits.type, np.float32))  # (width or its name, dtype)
        self.inputs = {i.name for i in session.get_inputs()}
        self.shared = self.cached and "position_ids" not in self.inputs
        self.buffers: dict[str, np.ndarray] = {}  # past name → (1, heads, capacity, head_dim), when shared
        self.values: dict = {}  # past name → the OrtValue over its buffer's memory
        self.binding = None  # when shared: the session's I/O binding over the buffers
        self.ids = np.zeros((1, 0), dtype=np.int64)
        self._past: dict[str, np.ndarray] = {}

    def start(self, prompt: np.ndarray) -> np.ndarray:
        self.ids = np.asarray(prompt, dtype=np.int64).reshape(1, -1)
        self._past = {}
        if self.shared:
            self.buffers, self.values = {}, {}
            return self._bound(self.ids, self.prompt_options)[-1]
        feed = full_feed(self.session, {"input_ids": self.ids, "attention_mask": np.ones_like(self.ids)})
        return self._run(feed, self.prompt_options)[-1]

    def step(self, token: int) -> np.ndarray:
        return self.extend([token])[-1]

    def extend(self, tokens) -> np.ndarray:
        """The logits (n, V) after each of the n ≥ 1 `tokens`, read in one pass over the weights (the
        cache holding what came before): row j scores the token after tokens[j]."""
        new = np.asarray(tokens, dtype=np.int64).reshape(1, -1)
        self.ids = np.concatenate([self.ids, new], axis=1)
        mask = np.ones_like(self.ids)
        if self.shared:
            return self._bound(new)
        if not self.cached:
            return self._run(full_feed(self.session, {"input_ids": self.ids, "attention_mask": mask}))[-new.shape[1] :]
        total = self.ids.shape[1]
        position = np.arange(total - new.shape[1], total, dtype=np.int64)[None]
        return self._run({"input_ids": new, "attention_mask": mask, "position_ids": position, **self.past})

    def rollback(self, length: int) -> None:
        """Forget every token after the first `length`: the next pass reads from there (a shared cache's
        later entries are written over, a fed one is cut)."""
        self.ids = self.ids[:, :length]
        self._past = {name: value[:, :, :length] for name, value in self._past.items()}

    def _bound(self, new: np.ndarray, options=None) -> np.ndarray:
        """The logits (n, V) after each of the n `new` ids, the pasts' buffers (grown by doubling) bound as
        the presents."""
        import onnxruntime as ort

        total = self.ids.shape[1]
        held = next(iter(self.buffers.values())).shape[2] if self.buffers else 0
        if total > held:
            capacity = max(2 * held, total + SHARED_START)
            for i in self.session.get_inputs():
                if i.name.startswith(PAST):
                    grown = np.zeros((1, i.shape[1], capacity, self._head_dim(i)), dtype=cache_dtype(i))
                    if held:
                        grown[:, :, :held] = self.buffers[i.name]
                    self.buffers[i.name] = grown
                    self.values[i.name] = ort.OrtValue.ortvalue_from_numpy(grown)  # written in place
            self.binding = self.session.io_binding()  # the buffers bound once, the ids each step
            for name, value in self.values.items():
                self.binding.bind_ortvalue_input(name, value)
                self.binding.bind_ortvalue_output(name.replace(PAST, PRESENT, 1), value)
        # written into an array of its own, which goes with it: not into the session's memory arena, and read
        # without the binding's outputs (wrapping every present's OrtValue and copying the logits: 0.13 ms a step,
        # 3 % of SmolLM2's 4-bit step)
        logits = self._logits_buffer(new.shape[1])
        if logits is None:
            self.binding.bind_output("logits")  # allocated by the run, of this step's length
        else:
            self.binding.bind_output("logits", "cpu", 0, logits.dtype, logits.shape, logits.ctypes.data)
        self.binding.bind_cpu_input("input_ids", new)
        self.binding.bind_cpu_input("attention_mask", np.ones((1, total), dtype=np.int64))
        self.session.run_with_iobinding(self.binding, options)
        return (self.binding.get_outputs()[-1].numpy() if logits is None else logits)[0]

    def _logits_buffer(self, tokens: int) -> np.ndarray | None:
        """An array for the logits of `tokens` new ids, where the graph fixes the vocabulary's width."""
        width, dtype = self.logits_type
        return np.empty((1, tokens, width), dtype) if isinstance(width, int) else None

    @property
    def past(self) -> dict[str, np.ndarray]:
        """Each past the next step reads: (1, heads, tokens so far, head_dim)."""
        if not self.shared:
            return self._past
        return {name: buffer[:, :, : self.ids.shape[1]] for name, buffer in self.buffers.items()}

    def _head_dim(self, past) -> int:
        """A past's last dimension, which the graph must declare."""
        if isinstance(past.shape[3], int):
            return past.shape[3]
        raise CompressorError(f"the graph's {past.name} does not declare its head size")

    def _run(self, feed: dict, options=None) -> np.ndarray:
        feed = {n: v for n, v in feed.items() if n in self.inputs}
        out = dict(zip(self.outputs, self.session.run(None, feed, options)))
        if self.cached:
            self._past = {n.replace(PRESENT, PAST, 1): v for n, v in out.items() if n.startswith(PRESENT)}
        return out["logits"][0]


def _shrinking():
    """Run options that give the CPU memory arena back what a run took, at its end (ONNX Runtime's shrinkage)."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


def _choose(logits: np.ndarray, rng: np.random.Generator | None, temperature: float, top_k: int) -> int:
    """argmax (rng None), else a draw from softmax(logits / temperature) over the top_k."""
    if rng is None:
        return int(np.argmax(logits))
    top = np.argpartition(-logits, min(top_k, len(logits)) - 1)[:top_k]
    z = logits[top].astype(np.float64) / temperature
    p = np.exp(z - z.max())
    return int(rng.choice(top, p=p / p.sum()))


def decode_ids(
    session,
    prompt: np.ndarray,
    max_new_tokens: int,
    eos: int | None = None,
    sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 50,
    seed: int = 0,
) -> list[int]:
    """The new token ids after `prompt` (1-D ids): greedy, or sampled with a seeded generator; stops
    after `eos`."""
    rng = np.random.default_rng(seed) if sample else None
    decoder = Decoder(session)
    logits = decoder.start(prompt)
    new: list[int] = []
    while len(new) < max_new_tokens:
        new.append(_choose(logits, rng, temperature, top_k))
        if new[-1] == eos or len(new) == max_new_tokens:
            break
        logits = decoder.step(new[-1])
    return new


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
    prefill's activations given back at its end, within its time: Decoder)."""
    decoder = Decoder(session, use_cache, shrink)
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
    pairs: bool = False,
) -> list[dict]:
    """Per graph, at batch 1 and each context length (the first tokens of `stream`, repeated when
    shorter): {"ctx128": {prefill_ms, per_token_p50_ms, per_token_p90_ms, tokens_per_s}, …}. The
    graphs take turns, one prefill and `new_tokens` steps each, for `rounds` rounds; the first round
    is a warm-up, and the time per token is over every step of the others. With `pairs`, the first graph takes
    turns with each other one in a run of its own (two sessions held at once, not all: an LM's fp32 graph beside
    its three quantized rows was 4.8 GB at 0.5B), its figures over all its turns: each row is timed beside it. Each
    session gives its memory arena back what its prefill took (within the prefill's time): the sessions held at
    once each kept their longest prompt's activations (Qwen2.5-0.5B's shape, four rows: 1.2 GB)."""
    runs = [[0, i] for i in range(1, len(paths))] if pairs and len(paths) > 2 else [list(range(len(paths)))]
    kept: list[dict[int, list[DecodeTimes]]] = [{length: [] for length in contexts} for _ in paths]
    failed: dict[int, str] = {}  # graph index → what ONNX Runtime said when it could not decode it
    bar = tqdm(
        total=len(contexts) * (rounds + 1) * sum(map(len, runs)),
        desc="decode: prefill and time per token",
        disable=not progress,
    )
    for run in runs:  # a run's sessions go with its call, before the next run's are made
        sessions = {i: make_session(paths[i], threads=threads) for i in run if i not in failed}
        _take_turns(sessions, stream, new_tokens, rounds, kept, bar, failed)
        del sessions
    bar.close()
    return [
        {"failed": failed[i]} if i in failed else {f"ctx{n}": _pooled(turns).summary() for n, turns in times.items()}
        for i, times in enumerate(kept)
    ]


def _take_turns(
    sessions: dict, stream: np.ndarray, new_tokens: int, rounds: int, kept: list[dict], bar, failed: dict[int, str]
) -> None:
    """`sessions` (graph index → session) taking turns at each context length of `kept` (graph index → context
    length → the turns' DecodeTimes, added to), the first of `rounds` + 1 rounds a warm-up; a graph ONNX Runtime
    fails to decode leaves the turns, what it said kept in `failed` (graph index → sentence)."""
    for length in kept[next(iter(sessions))] if sessions else ():
        context = np.resize(stream, length)
        for round_ in range(rounds + 1):
            for i, session in list(sessions.items()):
                try:
                    measured = decode_times(session, context, new_tokens, shrink=True)
                except runtime_errors() as error:
                    failed[i] = f"decoding after {length} tokens of context failed: {_first_line(error)}"
                    del sessions[i]
                    continue
                trim_heap()  # what the turn freed given back before the next session's (not timed)
                bar.update()
                if round_:
                    kept[i][length].append(measured)


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _pooled(turns: list[DecodeTimes]) -> DecodeTimes:
    """The median prefill of `turns` and every step of them."""
    return DecodeTimes(float(np.median([t.prefill_ms for t in turns])), [ms for t in turns for ms in t.step_ms])


def context_length(folder: Path) -> int | None:
    """The most positions the model in `folder` takes, from its config.json (None when it does not say)."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return next((config[k] for k in ("max_position_embeddings", "n_positions", "n_ctx") if k in config), None)
