"""bench(...): measure ONNX encoders side by side in one run; the first is the reference."""

from pathlib import Path

from tqdm.auto import tqdm

from eval.graph import check_encoder_graph, file_bytes, initializer_stats, load_graph, optimized_initializer_bytes
from eval.latency import SETTINGS, measure_latency
from eval.memory import peak_rss
from eval.quality import cosine_mean, encode_passages, load_tokenizer, recall_at_k, sentence_embeddings

__all__ = ["bench", "parity_of"]

PARITY_KEY = "compressor.parity_max_abs"


def parity_of(path: str | Path) -> float | None:
    """The parity export recorded in the file's metadata, if any."""
    props = {p.key: p.value for p in load_graph(path, with_data=False).metadata_props}
    return float(props[PARITY_KEY]) if PARITY_KEY in props else None


def bench(
    variants: list[tuple[str, Path]],
    tokenizer_dir: Path,
    eval_texts: list[str],
    eval_text: str,
    model: str,
    runs: int = 50,
    settings=None,
    rss_shape: tuple[int, int] = (8, 128),
    rss_repeats: int = 1,
    progress: bool = True,
) -> dict:
    """The report dict (DESIGN §5): size, optimised initializer bytes, latency, peak RSS,
    quality against variants[0], parity, for each (name, onnx path). Peak RSS runs one batch
    of `rss_shape` (batch, sequence); latency uses `settings` (default: latency.SETTINGS)."""
    settings = SETTINGS if settings is None else settings
    for _, path in variants:
        check_encoder_graph(path)  # every file checked before any is measured
    tokenizer = load_tokenizer(tokenizer_dir)
    batches = encode_passages(tokenizer, eval_texts)
    vocab = tokenizer.vocab_size  # latency and RSS inputs draw ids from [0, vocab)
    reference = None
    rows = []
    for name, path in tqdm(variants, desc="bench: size, memory, quality", disable=not progress):
        params, _ = initializer_stats(load_graph(path))
        emb = sentence_embeddings(path, batches)
        reference = emb if reference is None else reference
        rows.append(
            {
                "name": name,
                "onnx_path": str(path),
                "params": params,
                "file_bytes": file_bytes(path),
                "optimized_initializer_bytes": optimized_initializer_bytes(path),
                **peak_rss(path, vocab, *rss_shape, repeats=rss_repeats),
                "quality": {
                    "cosine_mean": round(cosine_mean(reference, emb), 4),
                    "recall_at_10": round(recall_at_k(reference, emb, 10), 4),
                },
                "parity_max_abs": parity_of(path),
            }
        )
    latencies = measure_latency([p for _, p in variants], vocab, settings, runs, progress=progress)
    for row, latency in zip(rows, latencies):
        row["latency_ms"] = latency
    return {"model": model, "eval_text": f"{eval_text}, {len(eval_texts)} passages", "variants": rows}
