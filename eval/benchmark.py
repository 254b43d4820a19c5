"""bench(...): measure ONNX models side by side in one run; the first is the reference."""

import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
from tqdm.auto import tqdm

from compressor.errors import CompressorError
from decoding.context import context_length
from eval.decode_timing import DECODE_CONTEXTS, DECODE_TOKENS, measure_decode
from eval.environment import file_sha256, graph_sha256, machine, run_record, texts_sha256
from eval.goals import DEFAULT_GOAL, choose
from eval.graph import (
    file_bytes,
    initializer_stats,
    load_graph,
    numbers_session,
    optimized_initializer_bytes,
    runtime_errors,
)
from eval.kinds import graph_kind
from eval.latency import SETTINGS, measure_latency
from eval.memory import peak_rss, trim_heap
from eval.pareto import mark_pareto_
from texts.tokens import encode_passages, load_tokenizer

__all__ = ["bench", "bench_inputs", "BenchInputs", "parity_of", "GATE_FAILED_KEY"]

PARITY_KEY = "compressor.parity_max_abs"
GATE_FAILED_KEY = "compressor.gate_failed"  # a graph kept off its gate says why (quantize_onnx's keep_failed)
WIDTH_KEY = "compressor.width"  # the bits a quantized graph's weights are named by (8: the rows int8 is measured by)
LATENCY_INPUT = "the eval text's first batch × seq tokens, in windows of seq"


def _props(path: str | Path) -> dict[str, str]:
    return {p.key: p.value for p in load_graph(path, with_data=False).metadata_props}


def parity_of(path: str | Path) -> float | None:
    """The parity export recorded in the file's metadata, if any."""
    props = _props(path)
    return float(props[PARITY_KEY]) if PARITY_KEY in props else None


class BenchInputs(NamedTuple):
    """What the bench feeds the graphs, tokenised once: the quality texts' padded batches by report key, the
    vocabulary that peak RSS's random ids are drawn from, the eval text's tokens in one stream (latency, decode)."""

    batches: dict[str, list[dict]]
    vocab: int
    stream: np.ndarray


def bench_inputs(tokenizer_dir: Path, eval_texts: list[str], second_texts: list[str] | None = None) -> BenchInputs:
    """`eval_texts` (and `second_texts`) tokenised by the tokenizer in `tokenizer_dir`, as `bench` reads them: a run
    whose bench goes on in a process without transformers tokenises them first (converters/pipeline/torch_free.py)."""
    tokenizer = load_tokenizer(tokenizer_dir)
    texts = {"quality": eval_texts, **({} if second_texts is None else {"quality_second_text": second_texts})}
    batches = {key: encode_passages(tokenizer, passages) for key, passages in texts.items()}
    vocab = tokenizer.vocab_size  # peak RSS inputs draw ids from [0, vocab)
    encoded = tokenizer(eval_texts, truncation=True, max_length=128)["input_ids"]  # as the quality sees them
    return BenchInputs(batches, vocab, np.array([i for ids in encoded for i in ids if i < vocab], dtype=np.int64))


def _failed(name: str, path: Path | str, error: str) -> dict:
    """A row the bench could not measure, said as it happens: its name, graph and what failed."""
    tqdm.write(f"compressor: bench: {name} left out of the report: {error}", file=sys.stderr)
    return {"name": name, "onnx_path": str(path), "error": error}


def bench(
    variants: list[tuple[str, Path]],
    tokenizer_dir: Path,
    eval_texts: list[str],
    eval_text: str,
    model: str,
    second_texts: list[str] | None = None,
    second_text: str | None = None,
    runs: int = 50,
    settings=None,
    rss_shape: tuple[int, int] = (8, 128),
    rss_repeats: int = 1,
    progress: bool = True,
    goal: str = DEFAULT_GOAL,
    inputs: BenchInputs | None = None,
) -> dict:
    """The report dict (docs/texts-and-measuring.md): what it ran on and with ("environment", "run": eval.environment),
    size and sha256, optimised initializer bytes, latency, peak RSS, quality against variants[0] (the metrics of the
    graphs' kind) on `eval_texts` and, when given, on `second_texts` (named `second_text`; an encoder's sentence
    embeddings as the modules of the folder `tokenizer_dir` compute them, eval.kinds), parity, the Pareto fronts it
    is on (eval.pareto), for each (name, onnx path). Peak RSS runs one batch of `rss_shape` (batch, sequence) of
    random ids (a causal LM: a prompt of its sequence, decoded on, GraphKind.memory_decode); latency uses `settings`
    on the eval text's tokens, the ids a model meets (a cached head with a computed tail costs what its text holds);
    "choice": the row to deploy for `goal` (eval.goals). `settings` None: latency.SETTINGS, or none for a kind timed
    otherwise (GraphKind.shape_latency: an LM by its prefill and time per token, eval.decode_timing). `inputs`: the
    texts as bench_inputs tokenises them, where the caller has them (None: tokenised here)."""
    if (second_texts is None) != (second_text is None):
        raise CompressorError("bench takes the second text's passages and its name together, or neither")
    kinds = [graph_kind(path) for _, path in variants]  # every file checked before any is measured
    kind = kinds[0]
    if settings is None:
        settings = SETTINGS if kind.shape_latency else ()
    for (_, path), other in zip(variants, kinds):
        if other is not kind:
            raise CompressorError(
                f"{str(path)!r} is a graph of the {other.name} kind; the original's is of the {kind.name} kind"
            )
    kind = kind.in_folder(tokenizer_dir)  # an encoder's sentence-transformers modules follow its graphs
    batches, vocab, stream = inputs or bench_inputs(tokenizer_dir, eval_texts, second_texts)
    references = {}  # quality key → what variants[0] gives on its text
    rows, failed = [], []
    for name, path in tqdm(variants, desc="bench: size, memory, quality", disable=not progress):
        params, _ = initializer_stats(load_graph(path, with_data=False))
        try:
            session = numbers_session(path)
            quality = {}
            for key, encoded in batches.items():
                represented = kind.represent(session, encoded, references.get(key))
                quality[key] = kind.quality(references.setdefault(key, represented), represented)
            del session  # one graph held at a time: an LM's fp32 graph is most of the memory
            trim_heap()  # what the quality freed given back while the probe's own process runs beside this one
            rss = peak_rss(path, vocab, *rss_shape, repeats=rss_repeats, decode=kind.memory_decode)
        except runtime_errors() as error:
            failed.append(_failed(name, path, f"ONNX Runtime could not run it: {str(error).strip().splitlines()[0]}"))
            if not rows:
                raise CompressorError(f"the bench's reference {name} failed ({failed[0]['error']})") from error
            continue
        rows.append(
            {
                "name": name,
                "onnx_path": str(path),
                "params": params,
                "file_bytes": file_bytes(path),
                "sha256": file_sha256(path),
                "graph_sha256": graph_sha256(path),
                "optimized_initializer_bytes": optimized_initializer_bytes(path),
                **rss,
                **quality,
                "parity_max_abs": parity_of(path),
            }
        )
        props = _props(path)
        if props.get(GATE_FAILED_KEY):
            rows[-1]["gate_failed"] = props[GATE_FAILED_KEY]
        if props.get(WIDTH_KEY):
            rows[-1]["width"] = int(props[WIDTH_KEY])
    del references  # the reference's predictions (SmolLM2's: 0.12 GiB), read by the quality alone
    trim_heap()  # given back before the sessions that are timed are made
    paths, stream = [row["onnx_path"] for row in rows], stream if len(stream) else None
    if settings:
        latencies = measure_latency(paths, vocab, settings, runs, progress=progress, stream=stream)
        for row, latency in zip(rows, latencies):
            row["latency_ms"] = latency
    if kind.name == "causal-lm" and stream is not None:  # what a user of an LM feels: time per generated token
        limit = context_length(tokenizer_dir) or max(DECODE_CONTEXTS) + DECODE_TOKENS
        contexts = [c for c in DECODE_CONTEXTS if c + DECODE_TOKENS <= limit]
        decoded = measure_decode(paths, stream, contexts, progress=progress)
        failed += [_failed(r["name"], r["onnx_path"], d["failed"]) for r, d in zip(rows, decoded) if "failed" in d]
        # a row that failed to decode leaves the report but the reference, kept for what else it measured
        rows = [{**row, "decode_ms": d} if "failed" not in d else row for row, d in zip(rows, decoded)]
        rows = rows[:1] + [row for row in rows[1:] if "decode_ms" in row]
    fed = LATENCY_INPUT if stream is not None else "random ids (the eval text holds no token)"
    report = {"model": model, "eval_text": f"{eval_text}, {len(eval_texts)} passages", "latency_input": fed}
    if second_texts is not None:
        report["second_text"] = f"{second_text}, {len(second_texts)} passages"
    report["run"], report["environment"] = run_record(), machine()
    report["environment"]["texts"] = {"eval": texts_sha256(eval_texts)}
    if second_texts is not None:
        report["environment"]["texts"]["second"] = texts_sha256(second_texts)
    report = {**report, "variants": rows, **({"failed": failed} if failed else {})}
    mark_pareto_(report, kind.front)
    choice = choose(report, goal)  # the row to deploy for `goal` on this CPU, by its goal's rule (eval.goals)
    return report if choice is None else {**report, "choice": choice}
