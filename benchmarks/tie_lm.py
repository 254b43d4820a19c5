"""Tie a trained language model's two tables (Press & Wolf) and try Liu et al.'s normalised tied
heads, with the Python API, on a Hugging Face LM or on a model of your own (the LSTM LM of
tools/lstm_lm.py, wrapped in OwnLM by module name). Every variant gets the same brief
distillation fine-tune from the original (a step budget, so that a busy machine changes its time,
not its result), is exported to ONNX (parity-checked) and benched beside the original and its int8
copy: parameters, file size, perplexity, top-1 agreement and KL on the LM eval text and on news.

    python benchmarks/tie_lm.py runs/lm/lstm --inits output input mean --out runs/tie/lstm
    python benchmarks/tie_lm.py runs/lm/gpt2-untied --inits output input mean --out runs/tie/gpt2
    python benchmarks/tie_lm.py runs/lm/gpt2 --scores dot l2 square distance cosine --out runs/tie/scores
    python benchmarks/tie_lm.py runs/lm/gpt2 --scores dot l2 square distance cosine --rank 30 --out runs/tie/scores-r30

A model tied already keeps its table (the init is moot); --rank R then compresses the tied table to
a rank-R factorisation (SVD) that serves both ends, before the fine-tune."""

import argparse
import copy
import sys
from pathlib import Path

from compressor.tied_logits import TiedLogits
from compressor.tying import SCORES
from converters import LowRankConfig, Plan, compress_, export_onnx, load_model
from converters.finetune import Distillation, finetune_
from converters.finetune.config import FinetuneConfig
from converters.kinds import OwnLM, kind_of
from converters.quantization.quantize import quantize_onnx
from converters.quantization.registry import scheme_named
from converters.registry import compact_modules
from converters.tying import INITS, TieConfig
from eval import bench, markdown_table, write_report
from texts.corpus import SECOND
from texts.tokens import load_tokenizer
from tools import lstm_lm


def load(path: Path):
    """The model in `path` (a Hugging Face folder, or one of lstm_lm.py's wrapped by module name)."""
    if (path / lstm_lm.CONFIG_FILE).is_file():
        return OwnLM(lstm_lm.load(path), embedding="embedding", head="decoder")
    return load_model(path)[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path, help="a trained LM: a Hugging Face folder or an lstm_lm.py folder")
    p.add_argument("--inits", nargs="+", choices=INITS, default=["input"], help="what the shared table starts from")
    p.add_argument("--scores", nargs="+", choices=SCORES, default=["dot"], help="the tied head's scores to try")
    p.add_argument("--rank", type=int, default=None, help="compress the tied table to this rank (SVD) first")
    p.add_argument("--steps", type=int, default=300, help="fine-tune steps per variant (default: 300)")
    p.add_argument("--eval-passages", type=int, default=None, help="held-out passages per text (default: all)")
    p.add_argument("--runs", type=int, default=10, help="timed runs per latency setting (default: 10)")
    p.add_argument("--out", type=Path, required=True, help="folder for the ONNX files and the report")
    args = p.parse_args(argv)

    original = load(args.model)
    kind = kind_of(original)
    tokenizer = load_tokenizer(args.model)
    texts, where = kind.graph.passages(None, "finetune", minimum=2)
    held = min(64, len(texts) // 10)
    train, val = texts[:-held], texts[-held:]
    cfg = FinetuneConfig(steps=args.steps, seconds=None, trainable="all", layer_weight=0.0)
    args.out.mkdir(parents=True, exist_ok=True)
    variants = [("original", export_onnx(original, args.out / "original.onnx").path)]
    vocab = original.get_input_embeddings().num_embeddings
    int8 = quantize_onnx(variants[0][1], args.out / "original-int8.onnx", scheme_named("int8")(), vocab=vocab)
    variants.append(("original-int8", int8.path))
    entries = (("embeddings", LowRankConfig(rank=args.rank, fit="plain")),) if args.rank else ()
    tied = isinstance(original.get_output_embeddings(), TiedLogits)
    for init in [None] if tied else args.inits:  # a tied model keeps its table: no init to choose
        for score in args.scores:
            model = copy.deepcopy(original)
            plan = Plan(entries, tie=TieConfig(init, score))
            compress_(model, plan)
            name = plan.label()
            report = finetune_(
                Distillation(model, original, tokenizer, train, val, tuple(compact_modules().values())), cfg
            )
            print(f"{name}: {report.steps} steps in {report.seconds:.0f} s on {where}", file=sys.stderr)
            variants.append((name, export_onnx(model, args.out / f"{name}.onnx").path))
    eval_texts, eval_where = kind.graph.passages(None, "eval")
    second, second_where = kind.graph.passages(None, SECOND)
    n = args.eval_passages
    result = bench(
        variants,
        tokenizer_dir=args.model,
        eval_texts=eval_texts[:n],
        eval_text=eval_where,
        second_texts=second[:n],
        second_text=second_where,
        model=str(args.model),
        runs=args.runs,
    )
    write_report(result, args.out / "report.json")
    print(markdown_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
