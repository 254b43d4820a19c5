"""A compressed checkpoint: compressor.json (plan, compact module specs, source), the weights in
compressed.safetensors, and the source's config and tokenizer files. Loading rebuilds the structure,
then the weights; nothing is decomposed again.

The weights are not named model.safetensors so that `transformers` and `sentence-transformers`, which
know nothing of the compact modules, refuse the folder instead of building the source's dense structure
and initialising its missing table at random with only a warning (cosine 0.001 to the original's
embeddings). What they find instead is model.safetensors.index.json, a sharded checkpoint's index whose
one shard is named for the loader (REFUSAL_SHARD) and is absent: `AutoModel.from_pretrained` (and so
`SentenceTransformer`) stops on "No such file or directory: …/compressed-checkpoint--load-it-with-
converters.load_model.safetensors". `load_model` loads it; so does a version-1 checkpoint, whose weights
were model.safetensors."""

import json
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_model as load_safetensors
from safetensors.torch import save_model as save_safetensors
from torch import nn

from compressor.errors import CompressorError, PlanError, ShapeError
from converters.compress import CompressionReport, refuse_save_pretrained_
from converters.kinds import kind_for_config, kind_named, kind_of
from converters.loading import resolve_model_dir
from converters.plan import Plan
from converters.registry import compact_modules
from converters.submodules import set_submodule
from converters.tying import set_score_
from files.atomic import atomic_dir, tensor_bytes
from files.model_folder import copy_source_files

__all__ = [
    "CHECKPOINT_META",
    "CHECKPOINT_VERSION",
    "CHECKPOINT_WEIGHTS",
    "REFUSAL_INDEX",
    "REFUSAL_SHARD",
    "save_compressed",
    "load_model",
    "is_compressed_dir",
    "read_meta",
]

CHECKPOINT_META = "compressor.json"
CHECKPOINT_VERSION = 2
CHECKPOINT_WEIGHTS = "compressed.safetensors"
REFUSAL_INDEX = "model.safetensors.index.json"  # what transformers reads for a sharded checkpoint's weights
REFUSAL_SHARD = "compressed-checkpoint--load-it-with-converters.load_model.safetensors"  # never written
WEIGHTS_OF_VERSION = {1: "model.safetensors", 2: CHECKPOINT_WEIGHTS}  # versions load_model reads


def is_compressed_dir(path: Path) -> bool:
    return (path / CHECKPOINT_META).is_file()


def save_compressed(
    model: nn.Module,
    plan: Plan,
    report: CompressionReport,
    source: Path,
    out_dir: Path,
    finetune: dict | None = None,
) -> Path:
    """Write the checkpoint to a temporary directory and rename it to `out_dir` when whole."""
    known = compact_modules()
    compact: dict[str, dict] = {}
    for name, m in model.named_modules():
        inside = any(name.startswith(outer + ".") for outer in compact)  # a head-tail's own tail
        if type(m).__name__ in known and not inside:
            compact[name] = {"type": type(m).__name__, "spec": m.spec.to_dict()}
    kind = kind_of(model)
    meta = {
        "version": CHECKPOINT_VERSION,
        "kind": kind.name,
        "source": str(source),
        "plan": plan.to_dict(),
        "modules": compact,
        "report": report.to_dict(),
        "finetune": finetune,
    }
    with atomic_dir(Path(out_dir), needed=tensor_bytes(model.state_dict().values())) as tmp:
        kind.save_config(model, tmp)
        copy_source_files(source, tmp)  # its tokenizer and sentence-transformers files, not its config
        save_safetensors(model, str(tmp / CHECKPOINT_WEIGHTS))
        (tmp / CHECKPOINT_META).write_text(json.dumps(meta, indent=2))
        refusal = {
            "metadata": {"compressor": "a compressed checkpoint: load it with converters.load_model"},
            "weight_map": {next(iter(model.state_dict())): REFUSAL_SHARD},
        }
        (tmp / REFUSAL_INDEX).write_text(json.dumps(refusal, indent=2))
    return Path(out_dir)


def read_meta(path: Path) -> dict:
    """compressor.json of a compressed checkpoint, checked for its version."""
    try:
        meta = json.loads((Path(path) / CHECKPOINT_META).read_text())
    except FileNotFoundError:
        raise CompressorError(f"{str(path)!r} is not a compressed checkpoint: it has no {CHECKPOINT_META}") from None
    except json.JSONDecodeError as e:
        raise CompressorError(f"{Path(path) / CHECKPOINT_META} is not valid JSON: {e}") from None
    if meta.get("version") not in WEIGHTS_OF_VERSION:
        raise CompressorError(f"{path} was written by an unknown checkpoint version {meta.get('version')!r}")
    return meta


def _load_compressed(path: Path) -> nn.Module:
    meta = read_meta(path)
    kind = kind_named(meta.get("kind", "encoder"))  # checkpoints before kinds were encoders
    model = kind.from_config(path)
    names = {n for n, _ in model.named_modules()}
    known = compact_modules()
    for name, entry in meta["modules"].items():
        cls = known.get(entry["type"])
        if cls is None:
            raise PlanError(f"{path} holds an unknown compact module type {entry['type']!r}")
        if name not in names:
            raise PlanError(f"{path} names module {name!r}, which a {type(model).__name__} lacks")
        set_submodule(model, name, cls(cls.spec_type(**entry["spec"])))
    kind.tie_(model)
    tie = meta["plan"].get("tie")
    if tie is not None:
        set_score_(model, tie["score"])
    weights = path / WEIGHTS_OF_VERSION[meta["version"]]
    try:
        missing, unexpected = load_safetensors(model, str(weights), strict=False)
    except (RuntimeError, SafetensorError, FileNotFoundError) as e:
        first = str(e).strip().splitlines()[0]
        raise ShapeError(f"weights in {weights} do not fit the model: {first}") from None
    if missing or unexpected:
        raise ShapeError(
            f"weights in {weights} do not fit the model: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    return model.eval()


def load_model(model: str | Path | None) -> tuple[nn.Module, Path]:
    """(model, its directory) from a Hugging Face directory, a compressed checkpoint, or None
    for the default model."""
    path = resolve_model_dir(model)
    if not is_compressed_dir(path):
        return kind_for_config(path).load(path), path
    model = _load_compressed(path)
    refuse_save_pretrained_(model)
    return model, path
