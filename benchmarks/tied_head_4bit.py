"""The perplexity a causal LM's tied table and head cost in 4 bits (asymmetric round-to-nearest in blocks
of 32 along D, ONNX Runtime's range with 0 in it), in PyTorch: the floor that corrections of the linear
layers alone cannot go below (the corrected schemes give the head a rank of its own: BENCHMARKS.md, "The
head's rank"). `--head-rows h` keeps the table's first h rows exact (a byte-pair vocabulary numbers its
frequent tokens first); `--linears offsets`
rounds every other linear layer the same way (fp16 scales) and adds its blocks' offsets as the graph does
(converters/quantization/rounding/grid.py: int8 offsets, one scale a layer, multiplied in fp32 by the block sums),
`rounded` without them, `exact` (default) leaves them. First 150 passages of each held-out text, windows of
at most 128 tokens.

    python benchmarks/tied_head_4bit.py runs/lm/smollm2 [--head-rows 8192] [--linears offsets]"""

import argparse

import numpy as np
import torch

from converters.checkpoint import load_model
from converters.quantization.rounding.grid import stored_offsets
from eval.kinds import CAUSAL_LM
from texts.corpus import SECOND
from texts.tokens import load_tokenizer

PASSAGES, WINDOW, BLOCK = 150, 128, 32


def rounded(weight: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(`weight` (N × K) as asymmetric 4-bit blocks of `block` along K with fp16 steps give it back,
    s·(q − z); the mean error of each block, N × K / block)."""
    n, k = weight.shape
    b = weight.double().reshape(n, k // block, block)
    lo, hi = b.amin(-1, keepdim=True).clamp(max=0), b.amax(-1, keepdim=True).clamp(min=0)
    step = torch.where(hi > lo, (hi - lo) / 15, torch.ones_like(lo)).half().double()
    zero = torch.round(-lo / step).clamp(0, 15)
    q = (torch.round(b / step + zero).clamp(0, 15) - zero) * step
    return q.reshape(n, k).float(), (b - q).mean(-1)


def with_offsets(linear: torch.nn.Linear, offsets: torch.Tensor) -> None:
    """`linear` (its weight rounded) adding (x B) O, O (K / block × N) as stored (grid.stored_offsets)."""
    codes, scale = stored_offsets(offsets.T.numpy())
    stored = torch.from_numpy(codes.astype(np.float32) * scale)

    def hook(module, inputs, out):
        return out + inputs[0].reshape(*inputs[0].shape[:-1], -1, BLOCK).sum(-1) @ stored

    linear.register_forward_hook(hook)


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
    p.add_argument("--head-rows", type=int, default=0, help="the table's first rows kept exact")
    p.add_argument("--linears", choices=("exact", "rounded", "offsets"), default="exact")
    args = p.parse_args()
    torch.set_num_threads(2)
    model, source = load_model(args.model)
    tokenizer = load_tokenizer(source)
    table, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is None or head.weight is not table.weight:
        raise SystemExit(f"{args.model}: its table and head are not tied")
    if not 0 <= args.head_rows < table.num_embeddings:
        p.error(f"--head-rows is a number of table rows in [0, {table.num_embeddings}), got {args.head_rows}")
    splits = ("eval", SECOND)
    before = {s: perplexity(model.eval(), tokenizer, s) for s in splits}
    if args.linears != "exact":
        for linear in [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]:
            linear.weight.data, offsets = rounded(linear.weight.data)
            if args.linears == "offsets":
                with_offsets(linear, offsets)
    kept = table.weight.data[: args.head_rows].clone()
    table.weight.data = rounded(table.weight.data)[0]  # the head reads the same tensor
    table.weight.data[: args.head_rows] = kept
    what = f"table and head in 4 bits (first {args.head_rows} rows exact), linear layers {args.linears}"
    for s in splits:
        after = perplexity(model, tokenizer, s)
        print(f"{s}: original {before[s]:.3f}, {what}: {after:.3f} ({after / before[s]:.4f}×)")


if __name__ == "__main__":
    main()
