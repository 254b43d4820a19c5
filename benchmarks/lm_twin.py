"""A 4-bit LM graph against its own fp32 form: greedy parity of ONNX Runtime's tokens on the int4 graph
with `transformers`' `generate` on the same model holding the weights the graph multiplies by.

    python benchmarks/lm_twin.py runs/lm/smollm2 FOLDER [--json OUT]

FOLDER is `compressor export MODEL --quantize int4 --out FOLDER` of a Llama-style LM (the fused graph:
one q/k/v MatMul a layer). The twin is MODEL with every MatMulNBits weight read back from its codes
(converters.kinds.fused_decoder.rounded_twin: the q/k/v product split into its three projections, the
tied table the head's, whose codes the table's rows are gathered from). The graph runs as written
(MatMulNBits at accuracy level 4: the activations rounded to 8 bits on the fly, which no PyTorch model
computes) and with the level set to 0 (fp32 products of the same weights): 8 prompts × 32 new tokens,
as benchmarks/lm_decode.py.
"""

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch
from lm_decode import NEW_TOKENS, prompts  # beside this script
from onnx import helper

from converters.checkpoint import load_model
from converters.kinds.fused_decoder import rounded_twin
from decoding.sampling import decode_ids
from eval.graph import make_session
from files.model_folder import graph_in
from texts.tokens import load_tokenizer


def at_level(graph_path: Path, level: int, work: Path) -> Path:
    """A copy of the graph with every MatMulNBits at accuracy level `level`."""
    proto = onnx.load(str(graph_path))
    for node in proto.graph.node:
        if node.op_type == "MatMulNBits":
            kept = [a for a in node.attribute if a.name != "accuracy_level"]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute("accuracy_level", level)])
    path = work / f"level{level}.onnx"
    onnx.save_model(proto, str(path))
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("folder", type=Path)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    tokenizer = load_tokenizer(args.model)
    graph_path = graph_in(args.folder)
    model, _ = load_model(args.model)
    twin = rounded_twin(model, onnx.load(str(graph_path)).graph).eval()
    eos = twin.config.eos_token_id
    theirs = []
    for prompt in prompts(tokenizer):
        with torch.no_grad():
            out = twin.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
        theirs.append(out[0, len(prompt) :].tolist())
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for level in (4, 0):
            session = make_session(at_level(graph_path, level, Path(work)), threads=2)
            ours = [decode_ids(session, np.array(prompt), NEW_TOKENS, eos=eos) for prompt in prompts(tokenizer)]
            same = [a == b for a, b in zip(ours, theirs)]
            first = [next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), len(b)) for a, b in zip(ours, theirs)]
            rows.append(
                {
                    "graph": str(graph_path),
                    "accuracy_level": level,
                    "identical": f"{sum(same)}/{len(same)}",
                    "mean_first_difference": float(np.mean(first)),
                }
            )
    print(json.dumps(rows, indent=1))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
