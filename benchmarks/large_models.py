"""Compress time and peak memory on models larger than the default: a 250,002-row table (XLM-R's vocabulary,
every embedding method) and whole models of 22M to ~1B parameters (low rank on every linear layer).

    python benchmarks/large_models.py vocab --out runs/large     # a random 12-layer XLM-R, 250,002 × 384
    python benchmarks/large_models.py sizes --out runs/large     # 22M, 110M, 135M, ~1B: aware against plain

Each `compressor compress` runs in its own process, without the calibration cache (every run pays for its
statistics); its wall time and peak resident memory (the process's own, from wait4) are printed and
written to OUT/large_models.json (a run it holds already is skipped unless --again). The random models
are built once under OUT (weights at random: only time and memory are measured here, never quality).
`sizes` needs `make lm` for SmolLM2-135M."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from converters.loading import default_model_path

REPO = Path(__file__).resolve().parent.parent
SMOLLM2 = REPO / "runs" / "lm" / "smollm2"

VOCAB_RUNS = {
    "tt r32 plain": "--method tt --rank 32 --fit plain",
    "tt r32 aware": "--method tt --rank 32 --fit aware",
    "lowrank 0.25 plain": "--method lowrank --keep 0.25 --fit plain",
    "lowrank 0.25 aware": "--method lowrank --keep 0.25 --fit aware",
    "lowrank 0.25 fisher": "--method lowrank --keep 0.25 --fit fisher",
    "head 4096 + lowrank tail 0.125 aware": "--method lowrank --keep 0.125 --fit aware --dense-head 4096",
    "head 4096 + tt tail r32 aware": "--method tt --rank 32 --fit aware --dense-head 4096",
    "define (its default, fisher)": "--method define",
}
SIZE_PLAN = ["--method", "lowrank", "--targets", "linear", "--keep", "0.5"]
LARGE_CALIB_PASSAGES = "128"  # the ~1B model's calibration: 1,024 passages would take most of an hour here


def _xlmr_250k(out: Path) -> Path:
    """A random 12-layer XLM-R of paraphrase-multilingual-MiniLM's shape (250,002 × 384, 118M parameters)
    with the default model's tokenizer (its 30,522 ids are the only rows calibration sees)."""
    from transformers import AutoTokenizer, XLMRobertaConfig, XLMRobertaModel

    config = XLMRobertaConfig(
        vocab_size=250002,
        hidden_size=384,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=514,
        pad_token_id=0,
    )
    return _save(XLMRobertaModel(config), AutoTokenizer.from_pretrained(default_model_path()), out / "xlmr-250k")


def _bert_110m(out: Path) -> Path:
    """A random BERT-base (12 × 768, 110M parameters) with the default model's tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    return _save(BertModel(BertConfig()), AutoTokenizer.from_pretrained(default_model_path()), out / "bert-110m")


def _llama_1b(out: Path) -> Path:
    """A random Llama of Llama-3.2-1B's body (16 × 2048, SwiGLU 8192, 8 key-value heads) with SmolLM2's
    tokenizer and tied 49,152-row table: 1.07B parameters."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=8192,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return _save(LlamaForCausalLM(config), tokenizer, out / "llama-1b")


def _save(model, tokenizer, path: Path) -> Path:
    if not (path / "config.json").is_file():
        torch.manual_seed(0)
        model.eval().save_pretrained(path)
        tokenizer.save_pretrained(path)
    return path


def measure(model: Path, options: list[str], out: Path) -> dict:
    """One `compressor compress` in a process of its own: wall seconds, peak RSS (GiB), what it said; its
    checkpoint removed after."""
    argv = [sys.executable, "-m", "converters.cli", "compress", str(model), *options, "--no-cache", "--out", str(out)]
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    said = [line for line in err.splitlines() if line.startswith("compressor:")]
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{err[-2000:]}")
    shutil.rmtree(out)
    return {"seconds": round(seconds, 1), "peak_gib": round(usage.ru_maxrss / 2**20, 2), "said": said}


def _sizes(out: Path) -> dict[str, tuple[Path, list[str]]]:
    large = ["--calib-passages", LARGE_CALIB_PASSAGES]
    return {
        "22M all-MiniLM-L6-v2": (default_model_path(), []),
        "110M BERT-base (random)": (_bert_110m(out), []),
        "135M SmolLM2": (SMOLLM2, []),
        "1.07B Llama (random)": (_llama_1b(out), large),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("vocab", "sizes"))
    p.add_argument("--out", type=Path, default=Path("runs/large"))
    p.add_argument("--again", action="store_true", help="measure again what OUT/large_models.json already holds")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what == "vocab":
        model = _xlmr_250k(args.out)
        runs = {name: (model, options.split()) for name, options in VOCAB_RUNS.items()}
    else:
        runs = {
            f"{name}, {fit}": (model, [*SIZE_PLAN, "--fit", fit, *extra])
            for name, (model, extra) in _sizes(args.out).items()
            for fit in ("plain", "aware")
        }
    results_path = args.out / "large_models.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for name, (model, options) in runs.items():
        if name in results and not args.again:
            continue
        result = measure(model, options, args.out / "compressed")
        results[name] = {"model": str(model), "options": options, **result}
        print(f"{name:45s} {result['seconds']:7.1f} s  {result['peak_gib']:5.2f} GiB peak", flush=True)
        results_path.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
