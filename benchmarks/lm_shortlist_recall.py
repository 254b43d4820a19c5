"""Whether a shortlist head could stand in for a tied LM head: the share of positions whose exact argmax,
argmax_v h·E_v (h the final-normed hidden state, E the tied table), is among the k best of an activation-aware
rank-r score h·(E_r)ᵀ, E_r = the rank-r SVD of E S (S Sᵀ = the calibration hiddens' Gram) mapped back
(compressor.lowrank.whitened_factors), on the eval text and a second one. A shortlist must hold the argmax on
≥ 99.9 % of tokens for greedy decoding to keep its output. With --graphs, the same on two exported
graphs, one token at a time as a decoder reads them (the text's own tokens fed): how often the whole head's argmax
is among the tokens the shortlist head scores (`compressor export --shortlist K`), and how often their argmax agree.

    python benchmarks/lm_shortlist_recall.py runs/lm/smollm2 [--ranks 64 128 256] [--shortlists 32 128 512 1024]
        [--json OUT]
    python benchmarks/lm_shortlist_recall.py runs/lm/smollm2 --graphs WHOLE_FOLDER SHORTLIST_FOLDER [--json OUT]
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from compressor.lowrank import whitened_factors
from converters.checkpoint import load_model
from decoding.decoders import open_decoder
from eval.environment import machine, run_record
from eval.graph import make_session
from eval.kinds import CAUSAL_LM
from files.model_folder import graph_in
from texts.tokens import load_tokenizer

PASSAGES = {"calib": 200, "eval": 60, "second": 60}
MAX_TOKENS = 128
CHUNK = 256  # tokens scored at once: a 262k-token vocabulary's scores are 2 GB a thousand tokens in float64


@torch.no_grad()
def hiddens(model, tokenizer, split: str) -> torch.Tensor:
    """The final-normed hidden states of every token of the split's first PASSAGES[split] passages, float64."""
    passages, _ = CAUSAL_LM.passages(None, split)
    rows = []
    for text in passages[: PASSAGES[split]]:
        ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=MAX_TOKENS)["input_ids"]
        rows.append(model.model(input_ids=ids).last_hidden_state[0])
    return torch.cat(rows).double()


def graph_recall(tokenizer, whole: Path, short: Path) -> dict:
    """Per split: the share of tokens whose whole head's argmax the shortlist head scores, and whose argmax agree,
    each passage's first MAX_TOKENS tokens fed one at a time to both graphs (2 threads each)."""
    decoders = [open_decoder(make_session(graph_in(folder), threads=2)) for folder in (whole, short)]
    result = {}
    for split in ("eval", "second"):
        passages, _ = CAUSAL_LM.passages(None, split)
        held = same = steps = 0
        for text in passages[: PASSAGES[split]]:
            ids = tokenizer(text, truncation=True, max_length=MAX_TOKENS)["input_ids"]
            a, b = (d.start(np.array(ids[:1])) for d in decoders)
            for token in ids[1:]:
                held += bool(np.isfinite(b[a.argmax()]))
                same += int(a.argmax() == b.argmax())
                steps += 1
                a, b = (d.step(token) for d in decoders)
        result[split] = {"steps": steps, "argmax_held": round(held / steps, 5), "argmax_same": round(same / steps, 5)}
        print(f"{split} ({steps} steps): the whole head's argmax held {held / steps:.5f}, the same {same / steps:.5f}")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--ranks", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--shortlists", type=int, nargs="+", default=[32, 128, 512, 1024])
    p.add_argument("--graphs", type=Path, nargs=2, default=None, metavar=("WHOLE", "SHORTLIST"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.graphs:
        recall = graph_recall(load_tokenizer(args.model), *args.graphs)
        graphs = [str(g) for g in args.graphs]
        result = {"run": run_record(), "environment": machine(), "graphs": graphs, "recall": recall}
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
        return
    model, _ = load_model(args.model)
    model.eval()
    tokenizer = load_tokenizer(args.model)
    table = model.get_input_embeddings().weight.detach().double()
    calib = hiddens(model, tokenizer, "calib")
    texts = {split: hiddens(model, tokenizer, split) for split in ("eval", "second")}
    exact = {split: torch.cat([(c @ table.T).argmax(1) for c in h.split(CHUNK)]) for split, h in texts.items()}
    result = {"run": run_record(), "environment": machine(), "recall": {}}
    for rank in args.ranks:
        factors = whitened_factors(table, calib.T @ calib, rank)  # table ≈ up @ down
        for split, h in texts.items():
            for k in args.shortlists:
                held = torch.cat(
                    [
                        ((c @ factors.down.T) @ factors.up.T).topk(k, dim=1).indices == e[:, None]
                        for c, e in zip(h.split(CHUNK), exact[split].split(CHUNK), strict=True)
                    ]
                )
                held = held.any(1).double().mean().item()
                result["recall"][f"r{rank}-k{k}-{split}"] = round(held, 4)
                print(f"rank {rank}, shortlist {k}, {split} ({len(h)} tokens): argmax held {held:.4f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
