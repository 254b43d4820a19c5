"""The perplexity a causal LM's tied table and head cost in 4 bits alone (asymmetric round-to-nearest in
blocks of 32 along D, ONNX Runtime's range with 0 in it; every other weight exact), in PyTorch: the floor
that corrections of the linear layers alone cannot go below, since the corrected schemes leave the head
out. First 150 passages of each held-out text, windows of at most 128 tokens.

    python benchmarks/tied_head_4bit.py runs/lm/smollm2"""

import argparse

import numpy as np
import torch

from converters.checkpoint import load_model
from eval.kinds import CAUSAL_LM
from texts.corpus import SECOND
from texts.tokens import load_tokenizer

PASSAGES, WINDOW, BLOCK = 150, 128, 32


def rounded(weight: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """`weight` (V × D) as asymmetric 4-bit blocks of `block` along D give it back: s·(q − z)."""
    v, d = weight.shape
    b = weight.double().reshape(v, d // block, block)
    lo, hi = b.amin(-1, keepdim=True).clamp(max=0), b.amax(-1, keepdim=True).clamp(min=0)
    step = torch.where(hi > lo, (hi - lo) / 15, torch.ones_like(lo))
    zero = torch.round(-lo / step).clamp(0, 15)
    return ((torch.round(b / step + zero).clamp(0, 15) - zero) * step).reshape(v, d).float()


@torch.no_grad()
def perplexity(model, tokenizer, split: str) -> float:
    passages, _ = CAUSAL_LM.passages(None, split)
    nll, count = 0.0, 0
    for passage in passages[:PASSAGES]:
        ids = tokenizer(passage, return_tensors="pt")["input_ids"][:, :WINDOW]
        if ids.shape[1] < 2:
            continue
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
        nll -= float(logp.gather(1, ids[0, 1:, None]).sum())
        count += ids.shape[1] - 1
    return float(np.exp(nll / count))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a causal LM whose table and head are tied")
    args = p.parse_args()
    torch.set_num_threads(2)
    model, source = load_model(args.model)
    tokenizer = load_tokenizer(source)
    table, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is None or head.weight is not table.weight:
        raise SystemExit(f"{args.model}: its table and head are not tied")
    splits = ("eval", SECOND)
    before = {s: perplexity(model.eval(), tokenizer, s) for s in splits}
    table.weight.data = rounded(table.weight.data)  # the head reads the same tensor
    for s in splits:
        after = perplexity(model, tokenizer, s)
        print(f"{s}: original {before[s]:.3f}, table and head in 4 bits {after:.3f} ({after / before[s]:.4f}×)")


if __name__ == "__main__":
    main()
