"""The recovery curve: recall@10 on both held-out texts and the validation agreement against the steps of
one long fine-tune that measures along the way (not several restarted runs).

    python benchmarks/recovery_curve.py CKPT --steps 2000 --every 100 --out runs/curve

CKPT is a compressed encoder checkpoint (`compressor compress … --out CKPT`); it is not changed. The
fine-tune is `compressor finetune`'s (its defaults, the default fine-tune text or `--data`, on `--device`);
at every `--every` steps the student's sentence embeddings (PyTorch, mean-pooled, normalised) of the eval
text (pydoc) and the second text (news), or of `--texts EVAL SECOND` (files, one passage per line, for a
machine without them), are compared with the original's, as the bench compares graphs. Writes
OUT/curve.json and OUT/curve.png, and with `--save DIR` the fine-tuned student as a checkpoint. The
learning rate decays to 0 at the budget's end (`--steps`, or `--seconds` when it comes first), so a point
at step s is not what a run of s steps would give."""

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from converters.checkpoint import load_model, read_meta, save_compressed
from converters.compress import CompressionReport
from converters.finetune import Distillation, FinetuneRun, finetune_
from converters.finetune.config import FinetuneConfig
from converters.kinds import kind_of
from converters.pipeline.steps import finetune_texts
from converters.plan import Plan
from converters.registry import compact_modules
from eval.quality import mean_pool, recall_at_k
from texts.corpus import SECOND
from texts.tokens import encode_passages, load_tokenizer


@torch.no_grad()
def embeddings(model, batches) -> np.ndarray:
    model.eval()
    device = next(model.parameters()).device
    out = []
    for feed in batches:
        ids, mask = feed["input_ids"].to(device), feed["attention_mask"].to(device)
        pooled = mean_pool(model(input_ids=ids, attention_mask=mask).last_hidden_state, mask)
        out.append(torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy())
    return np.concatenate(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--every", type=int, default=100)
    p.add_argument("--seconds", type=float, default=None, help="a time budget too (default: steps alone)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--data", type=Path, default=None, help="the fine-tune text (default: the default one)")
    p.add_argument("--texts", type=Path, nargs=2, metavar=("EVAL", "SECOND"), default=(None, None))
    p.add_argument("--save", type=Path, default=None, help="write the fine-tuned student here as a checkpoint")
    p.add_argument("--out", type=Path, default=Path("runs/curve"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    student, _ = load_model(args.checkpoint)
    source = Path(read_meta(args.checkpoint)["source"])
    teacher, _ = load_model(source)
    tokenizer = load_tokenizer(source)
    kind = kind_of(student)
    texts = {}
    for split, path in zip(("eval", SECOND), args.texts):
        passages, where = kind.graph.passages(path, split)
        texts[split] = (where, encode_passages(tokenizer, passages, tensors="pt"))
    references = {split: embeddings(teacher, batches) for split, (_, batches) in texts.items()}
    points = []
    start = time.perf_counter()

    def write() -> None:
        named = {split: where for split, (where, _) in texts.items()}
        (args.out / "curve.json").write_text(json.dumps({"texts": named, "points": points}, indent=1))

    def measure(step: int, agreement: float, model) -> None:
        recalls = {split: recall_at_k(references[split], embeddings(model, b)) for split, (_, b) in texts.items()}
        points.append({"step": step, "validation": agreement, "seconds": time.perf_counter() - start, **recalls})
        print(json.dumps(points[-1]), flush=True)
        write()

    train, val, where = finetune_texts(args.data, kind)
    cfg = FinetuneConfig(steps=args.steps, seconds=args.seconds, eval_every=args.every, device=args.device)
    measure(0, float("nan"), student)
    report = finetune_(
        Distillation(student, teacher, tokenizer, train, val, tuple(compact_modules().values())),
        cfg,
        FinetuneRun(on_eval=measure),
    )
    points[0]["validation"] = report.start_val_cosine  # the last point is the budget's last validation
    write()
    print(f"{report.steps} steps in {report.seconds:.0f} s on {report.device}: {report.steps_per_second:.2f} steps/s")
    if args.save is not None:
        meta = read_meta(args.checkpoint)
        plan, made = Plan.from_dict(meta["plan"]), CompressionReport(**meta["report"])
        save_compressed(student, plan, made, source, args.save, finetune=report.to_dict())

    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    steps = [q["step"] for q in points]
    for split, label in (("eval", "recall@10, pydoc (eval)"), (SECOND, "recall@10, news (second)")):
        ax.plot(steps, [q[split] for q in points], marker="o", label=label)
    ax.plot(steps, [q["validation"] for q in points], linestyle="--", label="validation cosine (fit text)")
    ax.set_xlabel(f"fine-tune step (batch {cfg.batch_size or kind.finetune_batch}, {where.split(' (')[0][:40]}…)")
    ax.set_ylabel("against the original")
    ax.set_title(f"{args.checkpoint.name}: one {report.steps}-step fine-tune on {report.device}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "curve.png", dpi=120)
    print(f"wrote {args.out / 'curve.json'} and {args.out / 'curve.png'}")


if __name__ == "__main__":
    main()
