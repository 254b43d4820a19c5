"""Draft LMs made from a causal LM itself, for speculative decoding's candidates (decoding.speculative): its first N
layers, its final norm and its tied head, distilled for S seconds on its own outputs (KL at τ = 1 over the
fine-tune text, every parameter trained; S = 0: as cut), each exported to a 4-bit model folder that
`benchmarks/lm_against_genai.py --draft FOLDER` and `compressor generate --draft FOLDER` take.

    python benchmarks/lm_drafts.py MODEL --out DIR [--layers 6 10] [--seconds 0 240]

writes DIR/first{N}-{S}s (the PyTorch weights) and DIR/first{N}-{S}s-int4 (the draft's folder) for every pair."""

import argparse
import shutil
from pathlib import Path

import torch

from converters.checkpoint import load_model
from converters.cli import main as compressor
from converters.finetune.config import FinetuneConfig
from converters.kinds import kind_of
from converters.pipeline.steps import finetune_and_say, finetune_texts

RATE = 5e-4  # every parameter's: the cut model starts far from its teacher
SOURCE_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def first_layers(model: torch.nn.Module, n: int) -> torch.nn.Module:
    """`model` (a Llama-style LM) cut to its first `n` decoder layers, in place."""
    model.model.layers = torch.nn.ModuleList(list(model.model.layers)[:n])
    for index, layer in enumerate(model.model.layers):
        layer.self_attn.layer_idx = index
    model.config.num_hidden_layers = n
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:n]
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path, help="the causal LM's folder (Llama-style)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--layers", type=int, nargs="+", default=[6, 10], help="layers kept, from the first")
    p.add_argument("--seconds", type=float, nargs="+", default=[0, 240], help="distillation budgets (0: none)")
    args = p.parse_args()
    teacher, _ = load_model(args.model)
    for n in args.layers:
        for seconds in args.seconds:
            name = args.out / f"first{n}-{seconds:g}s"
            student = first_layers(load_model(args.model)[0], n)
            if seconds:
                config = FinetuneConfig(seconds=seconds, trainable="all", layer_weight=0.0, rest_lr=RATE)
                finetune_and_say(student, teacher, args.model, config, finetune_texts(None, kind_of(student)))
            student.save_pretrained(name)
            for file in SOURCE_FILES:
                if (args.model / file).is_file():
                    shutil.copy(args.model / file, name)
            code = compressor(["export", str(name), "--quantize", "int4", "--out", f"{name}-int4"])
            if code:
                raise SystemExit(f"the 4-bit export of {name} failed (exit {code})")


if __name__ == "__main__":
    main()
