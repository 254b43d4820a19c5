"""One sequence (batch 1) through a causal LM's session on ONNX Runtime, a decoder per way the graph is read:
`start(prompt)` reads the prompt (the prefill), `extend(tokens)` reads n ≥ 1 more tokens in one pass and gives the
logits (n, V) after each, `step(token)` one, `rollback(length)` forgets what came after the first `length`. A graph
with a key-value cache (eval.probe.PAST) has its presents fed back (FedDecoder) or, where its positions come from
the mask (GroupQueryAttention's: the fused decoder's, GenAI's), written into buffers bound in place (BoundDecoder,
as GenAI's own loop does); a graph without one, or a decoder told not to use it, reads the whole sequence again at
every pass (WholeDecoder). `open_decoder` picks the decoder a session takes."""

import numpy as np

from compressor.errors import CompressorError
from eval.probe import CACHE_TYPES, OUTPUT_CHUNK_BYTES, PAST, PRESENT, cache_dtype, full_feed, is_cached

__all__ = [
    "Decoder",
    "WholeDecoder",
    "FedDecoder",
    "BoundDecoder",
    "open_decoder",
    "SHARED_START",
    "PROMPT_LOGITS_BYTES",
]

SHARED_START = 256  # tokens of room past the prompt in a bound cache's first buffers
PROMPT_LOGITS_BYTES = OUTPUT_CHUNK_BYTES  # the logits a bound prompt's pass holds at most (64 MiB; the memory probe's)


class Decoder:
    """What every decoder holds: the session, the ids read so far (1, T) and `past`, each past the next pass
    reads (1, heads, T, head_dim; none without a cache). `shrink`: the session's memory arena given back what a
    prompt's pass took, at its end (sessions that take turns would each keep their prompt's activations: a 0.5B
    LM's logits alone are 311 MB at 512 tokens)."""

    past: dict[str, np.ndarray]

    def __init__(self, session, shrink: bool = False):
        self.session = session
        self.prompt_options = _shrinking() if shrink else None
        self.inputs = {i.name for i in session.get_inputs()}
        self.outputs = [o.name for o in session.get_outputs()]
        self.ids = np.zeros((1, 0), dtype=np.int64)

    def start(self, prompt: np.ndarray) -> np.ndarray:
        """The logits (V,) of the token after `prompt` (1-D ids), read from nothing held."""
        raise NotImplementedError

    def extend(self, tokens) -> np.ndarray:
        """The logits (n, V) after each of the n ≥ 1 `tokens`, read in one pass over the weights (the cache
        holding what came before): row j scores the token after tokens[j]."""
        raise NotImplementedError

    def step(self, token: int) -> np.ndarray:
        return self.extend([token])[-1]

    def rollback(self, length: int) -> None:
        """Forget every token after the first `length`: the next pass reads from there."""
        self.ids = self.ids[:, :length]

    def _read(self, tokens) -> np.ndarray:
        """`tokens` (1, n) added to the ids."""
        new = np.asarray(tokens, dtype=np.int64).reshape(1, -1)
        self.ids = np.concatenate([self.ids, new], axis=1)
        return new

    def _run(self, feed: dict, options=None) -> dict[str, np.ndarray]:
        """The session's outputs by name, fed the inputs of `feed` it takes."""
        feed = {n: v for n, v in feed.items() if n in self.inputs}
        return dict(zip(self.outputs, self.session.run(None, feed, options)))


class WholeDecoder(Decoder):
    """The whole sequence read at every pass, as a graph without a cache must (a cached graph's pasts empty)."""

    past: dict[str, np.ndarray] = {}

    def start(self, prompt: np.ndarray) -> np.ndarray:
        self.ids = np.asarray(prompt, dtype=np.int64).reshape(1, -1)
        return self._whole(self.prompt_options)[-1]

    def extend(self, tokens) -> np.ndarray:
        new = self._read(tokens)
        return self._whole()[-new.shape[1] :]

    def _whole(self, options=None) -> np.ndarray:
        feed = full_feed(self.session, {"input_ids": self.ids, "attention_mask": np.ones_like(self.ids)})
        return self._run(feed, options)["logits"][0]


class FedDecoder(Decoder):
    """The presents a pass returns fed back as the next pass's pasts; a rollback cuts them."""

    def __init__(self, session, shrink: bool = False):
        super().__init__(session, shrink)
        self.past = {}

    def start(self, prompt: np.ndarray) -> np.ndarray:
        self.ids = np.asarray(prompt, dtype=np.int64).reshape(1, -1)
        self.past = {}
        feed = full_feed(self.session, {"input_ids": self.ids, "attention_mask": np.ones_like(self.ids)})
        return self._fed(feed, self.prompt_options)[-1]

    def extend(self, tokens) -> np.ndarray:
        new = self._read(tokens)
        total = self.ids.shape[1]
        position = np.arange(total - new.shape[1], total, dtype=np.int64)[None]
        feed = {"input_ids": new, "attention_mask": np.ones_like(self.ids), "position_ids": position, **self.past}
        return self._fed(feed)

    def rollback(self, length: int) -> None:
        super().rollback(length)
        self.past = {name: value[:, :, :length] for name, value in self.past.items()}

    def _fed(self, feed: dict, options=None) -> np.ndarray:
        out = self._run(feed, options)
        self.past = {n.replace(PRESENT, PAST, 1): v for n, v in out.items() if n.startswith(PRESENT)}
        return out["logits"][0]


class BoundDecoder(Decoder):
    """The pasts are buffers (1, heads, capacity, head_dim), grown by doubling, that each pass writes its keys and
    values into, bound in place as the presents too (ONNX Runtime's I/O binding); a rollback leaves the later
    entries to be written over. The logits are written into an array of the decoder's own where the graph fixes
    the vocabulary's width: not into the session's memory arena, and read without the binding's outputs (wrapping
    every present's OrtValue and copying the logits: 0.13 ms a step, 3 % of SmolLM2's 4-bit step); there a prompt
    is read in equal pieces whose logits fit PROMPT_LOGITS_BYTES, a pass each, as llama.cpp reads its batches (a
    512-token prompt's logits were 0.54 GB on Gemma 3's 262,144 tokens, of which the next token reads one row)."""

    def __init__(self, session, shrink: bool = False):
        super().__init__(session, shrink)
        logits = next(o for o in session.get_outputs() if o.name == "logits")
        self.logits_type = (logits.shape[-1], CACHE_TYPES.get(logits.type, np.float32))  # (width or its name, dtype)
        self.buffers: dict[str, np.ndarray] = {}  # past name → its buffer
        self.values: dict = {}  # past name → the OrtValue over its buffer's memory
        self.binding = None  # the session's I/O binding over the buffers

    @property
    def past(self) -> dict[str, np.ndarray]:
        return {name: buffer[:, :, : self.ids.shape[1]] for name, buffer in self.buffers.items()}

    def start(self, prompt: np.ndarray) -> np.ndarray:
        prompt = np.asarray(prompt, dtype=np.int64).reshape(-1)
        self.ids = np.zeros((1, 0), dtype=np.int64)
        self._grow(0, len(prompt) + SHARED_START)
        width, dtype = self.logits_type
        per_pass = PROMPT_LOGITS_BYTES // (width * np.dtype(dtype).itemsize) if isinstance(width, int) else len(prompt)
        for piece in np.array_split(prompt, max(1, -(-len(prompt) // max(1, per_pass)))):
            logits = self._bound(self._read(piece), self.prompt_options)
        return logits[-1]

    def extend(self, tokens) -> np.ndarray:
        return self._bound(self._read(tokens))

    def _bound(self, new: np.ndarray, options=None) -> np.ndarray:
        """The logits (n, V) after each of the n `new` ids, the buffers grown to hold every id."""
        total = self.ids.shape[1]
        held = next(iter(self.buffers.values())).shape[2] if self.buffers else 0
        if total > held:
            self._grow(held, max(2 * held, total + SHARED_START))
        logits = self._logits_buffer(new.shape[1])
        if logits is None:
            self.binding.bind_output("logits")  # allocated by the run, of this pass's length
        else:
            self.binding.bind_output("logits", "cpu", 0, logits.dtype, logits.shape, logits.ctypes.data)
        self.binding.bind_cpu_input("input_ids", new)
        self.binding.bind_cpu_input("attention_mask", np.ones((1, total), dtype=np.int64))
        self.session.run_with_iobinding(self.binding, options)
        return (self.binding.get_outputs()[-1].numpy() if logits is None else logits)[0]

    def _grow(self, held: int, capacity: int) -> None:
        """Buffers of `capacity` positions holding the first `held` of the old ones, bound once (the ids each pass)."""
        import onnxruntime as ort

        for i in self.session.get_inputs():
            if i.name.startswith(PAST):
                grown = np.zeros((1, i.shape[1], capacity, _head_dim(i)), dtype=cache_dtype(i))
                if held:
                    grown[:, :, :held] = self.buffers[i.name]
                self.buffers[i.name] = grown
                self.values[i.name] = ort.OrtValue.ortvalue_from_numpy(grown)  # written in place
        self.binding = self.session.io_binding()
        for name, value in self.values.items():
            self.binding.bind_ortvalue_input(name, value)
            self.binding.bind_ortvalue_output(name.replace(PAST, PRESENT, 1), value)

    def _logits_buffer(self, tokens: int) -> np.ndarray | None:
        """An array for the logits of `tokens` new ids, where the graph fixes the vocabulary's width."""
        width, dtype = self.logits_type
        return np.empty((1, tokens, width), dtype) if isinstance(width, int) else None


def open_decoder(session, use_cache: bool = True, shrink: bool = False) -> Decoder:
    """The decoder `session`'s graph takes: bound where its positions come from the mask, fed where it takes
    position_ids, whole without a cache or with `use_cache` False."""
    if not (use_cache and is_cached(session)):
        return WholeDecoder(session, shrink)
    if "position_ids" in {i.name for i in session.get_inputs()}:
        return FedDecoder(session, shrink)
    return BoundDecoder(session, shrink)


def _head_dim(past) -> int:
    """A past's last dimension, which the graph must declare."""
    if isinstance(past.shape[3], int):
        return past.shape[3]
    raise CompressorError(f"the graph's {past.name} does not declare its head size")


def _shrinking():
    """Run options that give the CPU memory arena back what a run took, at its end (ONNX Runtime's shrinkage)."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options
