"""Session settings and inputs every measurement shares, with no imports beyond numpy and
onnxruntime, so that run as a script it is the memory probe of a fresh process:

    python eval/probe.py MODEL.onnx --batch 8 --seq 128 [--no-model]

loads the model, runs one batch of (1, 16) and one of (batch, seq), and prints {"peak_rss_bytes": …, "stages":
{stage: {"peak_bytes", "rss_bytes"}}}, the peak so far and the resident memory after the session is created
("session") and after each batch ("b1_s16", "b8_s128"); with --decode N (a causal LM's graph, used as it is used)
the second is a prompt of seq tokens read as a decoder reads it, then N tokens one at a time ("b1_s128_decode16");
with --no-model it imports the same libraries and does nothing else (the baseline)."""

import argparse
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

__all__ = [
    "session_options",
    "random_batch",
    "text_batch",
    "peak_rss_bytes",
    "PAST",
    "PRESENT",
    "full_feed",
    "is_cached",
    "positions",
    "empty_past",
    "OUTPUT_CHUNK_BYTES",
    "row_chunks",
    "PARITY_SHAPES",
    "sample_ids",
]

# A causal LM's graph with a key-value cache (Optimum's names: inputs input_ids, attention_mask, position_ids,
# past_key_values.{i}.key / .value (B, heads, past, head_dim); outputs logits, present.{i}.key / .value) reads a
# batch of text as a prefill: position_ids count the real tokens before each, and every past is empty.
PAST = "past_key_values."
PRESENT = "present."
PARITY_SHAPES = ((3, 13, 1), (1, 5, 2))  # the parity checks' (batch, sequence, seed), unlike the traced (2, 7)


def sample_ids(vocab: int, batch: int, seq: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask), int64 (batch, seq): random ids with the table's first and last rows present, and a padded row."""
    ids = np.random.default_rng(seed).integers(0, vocab, (batch, seq), dtype=np.int64)
    ids[0, 0], ids[-1, -1] = vocab - 1, 0
    mask = np.ones_like(ids)
    mask[-1, seq // 2 :] = 0
    return ids, mask


def is_cached(session) -> bool:
    """Whether the session's graph takes a key-value cache."""
    return any(i.name.startswith(PAST) for i in session.get_inputs())


def positions(mask: np.ndarray, new: int) -> np.ndarray:
    """(B, new) position ids of the last `new` tokens: each real token's count of real tokens before it
    (padding, left or right, takes no position)."""
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0)[:, -new:].astype(np.int64)


CACHE_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8}


def cache_dtype(past) -> type:
    """The numpy type of a past input (a session's NodeArg): float32, float16, or int8 (a quantized cache)."""
    return CACHE_TYPES.get(past.type, np.float32)


def empty_past(session, batch: int) -> dict[str, np.ndarray]:
    """Every past input of the session, empty: (batch, heads, 0, head_dim)."""
    return {
        i.name: np.zeros((batch, i.shape[1], 0, i.shape[3]), dtype=cache_dtype(i))
        for i in session.get_inputs()
        if i.name.startswith(PAST)
    }


def full_feed(session, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`feed` (input_ids, attention_mask …) restricted to the session's inputs; a cached graph's
    position_ids and empty pasts added, so that it reads the batch as a prefill."""
    names = {i.name for i in session.get_inputs()}
    out = {n: v for n, v in feed.items() if n in names}
    if "position_ids" in names and "position_ids" not in out:
        out["position_ids"] = positions(feed["attention_mask"], feed["input_ids"].shape[1])
    if is_cached(session):
        out.update(empty_past(session, feed["input_ids"].shape[0]))
    return out


# A batch's rows run together while the output they make stays under this: an LM's logits are rows × sequence ×
# vocabulary floats (SmolLM2's 49,152-token vocabulary at 32 × 128 tokens: 805 MB, Llama-3.2-1B's 128,256: 2.1 GB)
OUTPUT_CHUNK_BYTES = 64 * 2**20
# and what is computed of such an output, a block of its rows at a time (row_blocks)
BLOCK_BYTES = 16 * 2**20


def row_chunks(session, feed: dict[str, np.ndarray], limit: int = OUTPUT_CHUNK_BYTES, width: int | None = None):
    """`feed` cut into consecutive batches of whole rows whose first output, (rows, sequence, width) floats with
    the width the session's graph fixes (or `width`: the floats a token's outputs hold together), stays within
    `limit` bytes (at least one row each); whole when the width is not fixed or the feed is not a batch of ids.
    Rows are independent in every graph measured here, so the outputs are the batch's, cut."""
    ids = feed.get("input_ids")
    width = width or session.get_outputs()[0].shape[-1]
    if not isinstance(width, int) or ids is None or ids.ndim != 2:
        yield feed
        return
    rows = max(1, limit // (ids.shape[1] * width * 4))
    for start in range(0, ids.shape[0], rows):
        yield {name: value[start : start + rows] for name, value in feed.items()}


def decoded(session, seq: int, vocab: int, steps: int, seen=None) -> list[int]:
    """The `steps` tokens decoded one at a time (each the last pass's argmax) after a prompt of `seq` random ids at
    batch 1 read as a decoder reads one: with a cache, in equal pieces whose logits fit OUTPUT_CHUNK_BYTES, each pass
    fed the last one's presents as its pasts; without one, the whole sequence each pass. `seen(logits)` is given the
    last position's logits after the prompt and after each token. A causal LM's memory is this, not a batch's: Gemma
    3's (8, 128) batch held 1.07 GB of logits over its 262,144 tokens, of which a step reads a row."""
    ids = random_batch(1, seq, vocab)["input_ids"]
    names = {i.name for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    width = next(o.shape[-1] for o in session.get_outputs() if o.name == "logits")
    cached = is_cached(session)
    per_pass = OUTPUT_CHUNK_BYTES // (4 * width) if cached and isinstance(width, int) else seq
    past, read, logits, tokens = empty_past(session, 1), 0, None, []
    pieces = np.array_split(ids, -(-seq // max(1, per_pass)), axis=1)
    for step in range(len(pieces) + steps):
        if step >= len(pieces):
            tokens.append(int(logits.argmax()))
        new = pieces[step] if step < len(pieces) else np.array([tokens[-1:]], dtype=np.int64)
        if not cached and step >= len(pieces):  # the whole sequence again, the new token after it
            new, read = np.concatenate([ids, new], axis=1), 0
            ids = new
        read += new.shape[1]
        feed = {"input_ids": new, "attention_mask": np.ones((1, read), dtype=np.int64), **past}
        if "position_ids" in names:
            feed["position_ids"] = np.arange(read - new.shape[1], read, dtype=np.int64)[None]
        out = dict(zip(outputs, session.run(None, feed), strict=True))
        past = {n.replace(PRESENT, PAST, 1): v for n, v in out.items() if n.startswith(PRESENT)}
        logits = out["logits"][0, -1]
        if seen is not None and step >= len(pieces) - 1:
            seen(logits)
    return tokens


def row_blocks(*arrays: np.ndarray, limit: int | None = None):
    """Arrays of the same rows (n, width), cut into consecutive blocks of rows whose float64 copies stay within
    `limit` bytes (None: BLOCK_BYTES; at least one row each): what is done to a block in float64, or with an index
    per element (argpartition), costs a few times the block rather than the whole output (an LM's 64 MB chunk of
    logits made 0.4–0.5 GB of them); arrays of no rows, as one empty block."""
    rows = max(1, (limit or BLOCK_BYTES) // (8 * arrays[0].shape[-1]))
    for start in range(0, max(len(arrays[0]), 1), rows):
        yield tuple(a[start : start + rows] for a in arrays)


def session_options(
    threads: int = 1, arena: bool = True, optimized_path: Path | None = None, spin: bool = True, prepack: bool = True
):
    """ORT_ENABLE_ALL, `threads` intra-op threads, one inter-op thread, the CPU memory arena
    set explicitly (on, ONNX Runtime's default: with it off, glibc keeps freed activations and
    every model's peak RSS rises). `spin` False: the threads sleep when a run ends instead of spinning
    for the next (sessions that take turns, a draft and its verifier, would otherwise spin on each
    other's cores). `prepack` False: the kernels keep their weights as the graph holds them, for sessions that
    check numbers rather than time them (SmolLM2's fp32 graph: 0.53 GiB over the libraries, 0.85 with its packed
    copies, 3–5 % slower at (4, 128))."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = arena
    options.log_severity_level = 3
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if optimized_path is not None:  # its weights beside it: a graph past protobuf's 2 GB is written only so
        options.optimized_model_filepath = str(optimized_path)
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", f"{Path(optimized_path).name}.data"
        )
        # the graph is written as optimized, before the kernels pack their weights (never written): a session that
        # writes it packs none (Qwen2.5-0.5B's shape's fp32 graph: a peak of 4.56 GB with them, 2.68 without)
        prepack = False
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    return options


def random_batch(batch: int, seq: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random ids in [0, vocab) and a full attention mask, int64."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(batch, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def text_batch(stream: np.ndarray, batch: int, seq: int) -> dict[str, np.ndarray]:
    """The first batch × seq ids of a token stream (repeated when it is shorter), as `batch`
    consecutive windows of `seq`, and a full attention mask, int64: the ids a model meets in text,
    for graphs whose cost depends on which tokens come (a cached head and a computed tail)."""
    if len(stream) == 0:
        raise ValueError("a token stream to cut windows from must hold at least one token")
    ids = np.resize(np.asarray(stream, dtype=np.int64), batch * seq).reshape(batch, seq)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def peak_rss_bytes(field: str = "VmHWM") -> int:
    """VmHWM (the peak resident memory; `field` VmRSS: the resident memory now) of this process. (getrusage's
    ru_maxrss would carry the parent's peak across fork and exec on Linux.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024  # kB
    raise RuntimeError(f"/proc/self/status has no {field} line (peak RSS needs Linux)")


def _stage() -> dict[str, int]:
    """The resident memory now, then the peak so far (so that the peak read is never below the memory read)."""
    rss = peak_rss_bytes("VmRSS")
    return {"peak_bytes": peak_rss_bytes(), "rss_bytes": rss}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("onnx")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decode", type=int, default=0)
    parser.add_argument("--no-model", action="store_true")
    args = parser.parse_args()
    stages = {}
    if not args.no_model:
        options = session_options(threads=args.threads)
        session = ort.InferenceSession(args.onnx, options, providers=["CPUExecutionProvider"])
        stages["session"] = _stage()
        session.run(None, full_feed(session, random_batch(1, 16, args.vocab)))
        stages["b1_s16"] = _stage()
        if args.decode:
            decoded(session, args.seq, args.vocab, args.decode)
            stages[f"b1_s{args.seq}_decode{args.decode}"] = _stage()
        else:
            session.run(None, full_feed(session, random_batch(args.batch, args.seq, args.vocab)))
            stages[f"b{args.batch}_s{args.seq}"] = _stage()
    print(json.dumps({"peak_rss_bytes": peak_rss_bytes(), "stages": stages}))


if __name__ == "__main__":
    main()
