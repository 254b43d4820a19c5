"""The TT lookup alone in ONNX Runtime against a plain Gather, on the default model's table.

    python benchmarks/tt_lookup.py [--tokens 1024] [--ranks 32 128] [--json out.json]

For each rank it builds TTEmbedding.from_embedding on all-MiniLM-L6-v2's 30522×384 word
embedding, exports the embedding alone to ONNX (parity-checked), and times one call on
`tokens` random ids at 1 and 2 threads, the graphs taking turns; ratios are to the Gather
timed in the same run.
"""

import argparse
import json
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from compressor.tt_embedding import TTEmbedding
from converters.checkpoint import load_model
from converters.export import export_embedding_onnx
from eval.graph import file_bytes, make_session
from eval.latency import time_side_by_side


@dataclass
class Options:
    tokens: int = 1024
    ranks: list[int] = field(default_factory=lambda: [32, 128])
    cores: int = 2
    order: str = "pca"
    runs: int = 200
    threads: list[int] = field(default_factory=lambda: [1, 2])


def main() -> None:
    defaults = Options()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=defaults.tokens)
    parser.add_argument("--ranks", type=int, nargs="+", default=defaults.ranks)
    parser.add_argument("--cores", type=int, default=defaults.cores)
    parser.add_argument("--order", choices=["none", "pca"], default=defaults.order)
    parser.add_argument("--runs", type=int, default=defaults.runs)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    opts = Options(args.tokens, args.ranks, args.cores, args.order, args.runs)

    model, _ = load_model(None)
    table = model.get_input_embeddings()
    feed = {"input_ids": np.random.default_rng(0).integers(0, table.num_embeddings, (1, opts.tokens))}
    modules = {"gather": table}
    for rank in opts.ranks:
        modules[f"tt-r{rank}"] = TTEmbedding.from_embedding(table, rank=rank, num_cores=opts.cores, order=opts.order)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: export_embedding_onnx(m, Path(tmp) / f"{name}.onnx").path for name, m in modules.items()}
        for threads in opts.threads:
            sessions = [make_session(path, threads=threads) for path in paths.values()]
            timings = time_side_by_side(sessions, feed, runs=opts.runs, warmup=20)
            for (name, path), timing in zip(paths.items(), timings):
                rows.append({"name": name, "threads": threads, "file_bytes": file_bytes(path), **timing})
    for row in rows:
        base = next(r for r in rows if r["name"] == "gather" and r["threads"] == row["threads"])
        row["p50_vs_gather"] = round(row["p50"] / base["p50"], 2)
        print(
            f"{row['name']:>8}  threads {row['threads']}  p50 {row['p50']:.4f} ms  p90 {row['p90']:.4f} ms  "
            f"{row['p50_vs_gather']:.2f}× gather  file {row['file_bytes'] / 1e6:.2f} MB"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"options": asdict(opts), "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
