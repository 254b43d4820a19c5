"""The logits contraction alone, h Wᵀ for a batch of positions, in ONNX Runtime: a compressed tied
table's factors (low-rank, dense head + low-rank tail, TT) against the dense table, all at the same
compression of the table.

    python benchmarks/lm_logits.py [--positions 1024] [--ratio 8] [--json out.json]

The table is SmolLM2-135M's tied 49,152 × 576 embedding (runs/lm/smollm2, from `make lm`), or a
random one of that shape when it is absent (speed does not depend on the values). Each head is
exported alone as h (N, D) → logits (N, V), parity-checked against PyTorch, and the graphs are timed
taking turns at 1 and 2 threads; ratios are to the dense table timed in the same group. TT is timed
in a group of its own at --tt-positions (default 64) beside the dense table again: its contraction
holds an (N·d_2, v_1·r) intermediate, 6.2 GB at 1,024 positions and rank 329, which ran a 24 GB
machine out of memory.
"""

import argparse
import json
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from torch import nn

from compressor.head_tail import HeadTailEmbedding
from compressor.lowrank_embedding import LowRankEmbedding
from compressor.tied_logits import TiedLogits
from compressor.tt_embedding import TTEmbedding
from eval.graph import file_bytes, make_session, optimized_initializer_bytes
from eval.latency import time_side_by_side

SMOLLM2 = Path("runs/lm/smollm2/model.safetensors")


@dataclass
class Options:
    positions: int = 1024
    tt_positions: int = 64
    ratio: float = 8.0  # the table's parameters over each compressed form's
    head: int = 2048  # exact rows of the head + tail form
    runs: int = 100
    threads: list[int] = field(default_factory=lambda: [1, 2])


def smollm2_table() -> tuple[torch.Tensor, str]:
    if SMOLLM2.is_file():
        with safe_open(str(SMOLLM2), framework="pt") as f:
            return f.get_tensor("model.embed_tokens.weight").float(), str(SMOLLM2)
    return torch.randn(49152, 576, generator=torch.Generator().manual_seed(0)) * 0.05, "random 49152 × 576"


def largest_tt(table: torch.Tensor, budget: int) -> TTEmbedding:
    """The TT form of the highest rank whose cores hold at most `budget` floats (2 cores, PCA order)."""
    low, high = 1, 1024
    while low < high:
        mid = (low + high + 1) // 2
        params = sum(v * d for v, d in zip(*_dims(table))) * mid  # r_0 = r_2 = 1: (v_1 d_1 + v_2 d_2) · r
        low, high = (mid, high) if params <= budget else (low, mid - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TTEmbedding.from_weight(table, rank=low, order="pca")


def _dims(table):
    from compressor.factorize import balanced_factors

    return balanced_factors(table.shape[0], 2), balanced_factors(table.shape[1], 2)


def heads(table: torch.Tensor, opts: Options) -> dict[str, nn.Module]:
    rows, dim = table.shape
    budget = int(rows * dim / opts.ratio)
    rank = budget // (rows + dim)
    tail_rank = (budget - opts.head * dim) // (rows - opts.head + dim)
    dense = nn.Embedding.from_pretrained(table)
    tables = {
        "dense": dense,
        f"lowrank-r{rank}": LowRankEmbedding.from_weight(table, rank),
        f"head{opts.head}+lowrank-r{tail_rank}": HeadTailEmbedding.from_embedding(
            dense, torch.arange(opts.head), lambda w, ids: LowRankEmbedding.from_weight(w, tail_rank)
        ),
    }
    tt = largest_tt(table, budget)
    tables[f"tt-r{tt.spec.ranks[0]}"] = tt
    return {name: TiedLogits(t) for name, t in tables.items()}


class _Graph(nn.Module):
    def __init__(self, head: TiedLogits):
        super().__init__()
        self.table, self.head = head.embedding, head  # the table registered here, so export sees its weights

    def forward(self, h):
        return self.head(h)


def export(head: TiedLogits, path: Path, dim: int) -> float:
    graph = _Graph(head).eval()
    sample = torch.randn(7, dim)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            graph,
            (sample,),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["h"],
            output_names=["logits"],
            dynamic_axes={"h": {0: "n"}, "logits": {0: "n"}},
        )
        h = torch.randn(13, dim)
        expected = graph(h).numpy()
    (got,) = make_session(path).run(["logits"], {"h": h.numpy()})
    return float(np.abs(got - expected).max())


def main() -> None:
    defaults = Options()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--positions", type=int, default=defaults.positions)
    parser.add_argument("--tt-positions", type=int, default=defaults.tt_positions)
    parser.add_argument("--ratio", type=float, default=defaults.ratio)
    parser.add_argument("--head", type=int, default=defaults.head)
    parser.add_argument("--runs", type=int, default=defaults.runs)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    opts = Options(args.positions, args.tt_positions, args.ratio, args.head, args.runs)
    table, source = smollm2_table()
    dim = table.shape[1]
    made = heads(table, opts)
    groups = [  # (positions, the heads timed side by side at that count); the same count twice is two groups
        (opts.positions, [n for n in made if not n.startswith("tt")]),
        (opts.tt_positions, ["dense", *(n for n in made if n.startswith("tt"))]),
    ]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: Path(tmp) / f"{name}.onnx" for name in made}
        parity = {name: export(head, paths[name], dim) for name, head in made.items()}
        for group, (positions, names) in enumerate(groups):
            feed = {"h": np.random.default_rng(0).standard_normal((positions, dim)).astype(np.float32)}
            for threads in opts.threads:
                sessions = [make_session(paths[n], threads=threads) for n in names]
                for name, timing in zip(names, time_side_by_side(sessions, feed, runs=opts.runs, warmup=3)):
                    params = sum(p.numel() for p in made[name].embedding.parameters())
                    results.append(
                        {
                            "group": group,
                            "name": name,
                            "positions": positions,
                            "threads": threads,
                            "params": params,
                            "file_bytes": file_bytes(paths[name]),
                            "optimized_initializer_bytes": optimized_initializer_bytes(paths[name]),
                            "parity_max_abs": parity[name],
                            **timing,
                        }
                    )
    for row in results:
        base = next(
            r for r in results if r["name"] == "dense" and r["threads"] == row["threads"] and r["group"] == row["group"]
        )
        row["p50_vs_dense"] = round(row["p50"] / base["p50"], 3)
        print(
            f"{row['name']:>24}  positions {row['positions']:>5}  threads {row['threads']}  params "
            f"{row['params']:>11,} ({row['params'] / base['params']:.3f}×)  p50 {row['p50']:8.2f} ms  "
            f"p90 {row['p90']:8.2f} ms  {row['p50_vs_dense']:.3f}× dense  opt. init "
            f"{row['optimized_initializer_bytes'] / 1e6:.1f} MB  parity {row['parity_max_abs']:.1e}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"table": source, "options": asdict(opts), "results": results}
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
