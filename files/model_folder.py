"""A ready model folder: what sentence-transformers, Optimum, transformers.js and ONNX Runtime load as
it is. The source's config.json, generation_config.json and tokenizer files, every
sentence-transformers file it has (modules.json and the folders it names, such as 1_Pooling/,
sentence_bert_config.json, config_sentence_transformers.json), and the graph under onnx/ by the name
those tools look for at its width: model.onnx (fp32), model_quantized.onnx (8-bit; transformers.js'
`q8`), model_q4.onnx (4-bit; its `q4`); beside a fused decoder's graph, ONNX Runtime GenAI's
genai_config.json (files.genai_config). A compressed checkpoint's folder is one too: its graph goes
beside its weights, and its own config.json is kept."""

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

from google.protobuf.message import DecodeError

from compressor.errors import CompressorError
from files.atomic import atomic_dir, atomic_file
from files.genai_config import GENAI_CONFIG, write_genai_config
from files.onnx_files import load_onnx, read_props

__all__ = [
    "GRAPH_DIR",
    "graph_file",
    "model_folder",
    "check_model_folder",
    "copied_files",
    "copy_source_files",
    "load_lines",
    "own_ops",
    "lacks_tokenizer",
    "graph_in",
    "folder_of",
    "TARGET_KEY",
    "targets_held",
]

GRAPH_DIR = "onnx"
MARK = "compressor.parity_max_abs"  # the metadata every graph of ours carries (eval.benchmark.PARITY_KEY)
SOURCE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "merges.txt",
    "vocab.json",
    "sentencepiece.bpe.model",
    "spiece.model",
    "added_tokens.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
)
TOKENIZERS = ("tokenizer.json", "vocab.txt", "vocab.json", "sentencepiece.bpe.model", "spiece.model")
CHECKPOINT_MARK = "compressor.json"  # converters.checkpoint.CHECKPOINT_META
TARGETED = {8: "model_qint8_", 4: "model_q4_"}  # width → the name of a graph written for one CPU, before its target
TARGET_KEY = "compressor.target_cpu"  # the metadata naming the CPU an int8 graph's weights were written for


def graph_file(width: int | None, target: str | None = None) -> str:
    """The graph's path in the folder: onnx/model.onnx for fp32 (None), model_quantized.onnx for
    8-bit weights, model_q4.onnx for 4-bit (a mix of 4 and 8 bits counts as 4); one of several graphs each
    written for a CPU `target` (target_cpu.TARGETS), sentence-transformers' name for it: model_qint8_avx2.onnx,
    model_qint8_avx512_vnni.onnx … (model_q4_TARGET.onnx for 4-bit codes with int8 products)."""
    names = {None: "model.onnx", 8: "model_quantized.onnx", 4: "model_q4.onnx"}
    if width not in names:
        raise CompressorError(f"no graph name for {width}-bit weights; the names are for fp32, 8 and 4 bits")
    if target is not None and width is not None:
        return f"{GRAPH_DIR}/{TARGETED[width]}{target}.onnx"
    return f"{GRAPH_DIR}/{names[width]}"


def targets_held(folder: Path) -> dict[str, Path]:
    """The graphs of a model folder written one per CPU target (graph_file's names), by target."""
    held = {}
    for graph in sorted((Path(folder) / GRAPH_DIR).glob("*.onnx")):
        for prefix in TARGETED.values():
            if graph.stem.startswith(prefix):
                held[graph.stem[len(prefix) :]] = graph
    return held


def _ours(folder: Path) -> bool:
    """Empty, a compressed checkpoint, or a folder whose graphs we wrote."""
    if not any(folder.iterdir()) or (folder / CHECKPOINT_MARK).is_file():
        return True
    graphs = sorted((folder / GRAPH_DIR).glob("*.onnx"))
    return bool(graphs) and all(MARK in read_props(g) for g in graphs)


def check_model_folder(folder: Path) -> None:
    """Before any work: `folder` is absent, or a folder of ours (empty, a checkpoint, or graphs we
    wrote) that a graph may be added to; a file or someone else's folder is refused, named."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise CompressorError(f"cannot write the model folder {str(folder)!r}: a file of that name is there")
    if folder.is_dir() and not _ours(folder):
        raise CompressorError(
            f"{str(folder)!r} is a folder that compressor did not write (no compressor.json, no graph of ours "
            f"under {GRAPH_DIR}/); give --out a new folder"
        )


def _module_dirs(source: Path) -> list[str]:
    """The folders modules.json names (1_Pooling, 2_Normalize …) that the source has."""
    if not (source / "modules.json").is_file():
        return []
    paths = [m.get("path", "") for m in json.loads((source / "modules.json").read_text())]
    return [p for p in paths if p and (source / p).is_dir()]


def copied_files(source: Path) -> list[str]:
    """The source's files (and folders) a ready folder holds a copy of."""
    return [n for n in SOURCE_FILES if (source / n).is_file()] + _module_dirs(source)


@contextlib.contextmanager
def model_folder(folder: Path, source: Path, width: int | None, target: str | None = None) -> Iterator[Path]:
    """Yield the path to write the graph to (graph_file(width, target)); then copy the source's files beside it
    (those the folder lacks: a checkpoint keeps its own config.json). A new folder appears only when whole; in
    a folder of ours, each file is replaced whole."""
    folder, source = Path(folder), Path(source)
    new = not folder.exists()
    with atomic_dir(folder) if new else contextlib.nullcontext(folder) as work:
        graph = work / graph_file(width, target)
        graph.parent.mkdir(parents=True, exist_ok=True)
        try:
            yield graph
            copy_source_files(source, work)
            write_genai_config(work, graph)
        except CompressorError as e:  # said of the folder's final name, not of its temporary one
            raise type(e)(str(e).replace(str(work), str(folder))) from None


def copy_source_files(source: Path, folder: Path) -> None:
    """Copy the source's files that `folder` lacks into it (copied_files), each whole."""
    for name in copied_files(source):
        if (folder / name).exists():
            continue
        if (source / name).is_dir():
            shutil.copytree(source / name, folder / name)
        else:
            with atomic_file(folder / name) as tmp:
                shutil.copy2(source / name, tmp)


def own_ops(graph: Path) -> list[str]:
    """The ONNX Runtime operators (domain com.microsoft) the graph uses: it runs only in ONNX Runtime."""
    proto = load_onnx(graph, weights=False)
    return sorted({n.op_type for n in proto.graph.node if n.domain == "com.microsoft"})


def load_lines(folder: Path, graph: str, kind: str) -> list[str]:
    """The lines that load `folder`'s graph (`graph`, relative) in the tools its users run."""
    folder = Path(folder)
    file_name = {} if graph == graph_file(None) else {"file_name": graph}
    lines = []
    if kind == "encoder" and (folder / "modules.json").is_file():
        kwargs = f', model_kwargs={{"file_name": "{graph}"}}' if file_name else ""
        lines.append(f'SentenceTransformer("{folder}", backend="onnx"{kwargs})')
    if kind == "encoder":
        name = Path(graph).name
        lines.append(
            f'ORTModelForFeatureExtraction.from_pretrained("{folder}", subfolder="{GRAPH_DIR}", file_name="{name}")'
        )
    lines.append(f'onnxruntime.InferenceSession("{folder / graph}")')
    if (folder / GENAI_CONFIG).is_file():
        lines.append(f'onnxruntime_genai.Model("{folder}")')
    return lines


def graph_in(path: Path, target: str | None = None, fallback: str | None = None) -> Path:
    """The graph `path` names: an ONNX file, or a model folder's one graph under onnx/, or of its graphs written
    one per CPU (graph_file), the one for `target` (not given: for `fallback`, the machine's own). A graph asked
    for a `target` it was not written for (its metadata names another) is refused."""
    path = Path(path)
    graph = _graph_of_folder(path, target or fallback) if path.is_dir() else path
    written = None if target is None else _written_for(graph)  # a graph's metadata read only when asked
    if written is not None and written != target:
        raise CompressorError(
            f"{str(graph)!r} was written for {written}, not {target}: its int8 weights are that CPU's (compressor "
            f"export --quantize SCHEME --target-cpu {target} writes one for {target})"
        )
    return graph


def _graph_of_folder(path: Path, target: str | None) -> Path:
    graphs = sorted((path / GRAPH_DIR).glob("*.onnx"))
    held = targets_held(path)
    if held and target not in held:
        raise CompressorError(
            f"{str(path)!r} holds graphs for {', '.join(held)} ({', '.join(g.name for g in held.values())}), "
            f"not for {target or 'no CPU named'}: ask one of those (--target-cpu)"
        )
    if held:
        return held[target]
    if len(graphs) != 1:
        names = ", ".join(g.name for g in graphs) or "none"
        raise CompressorError(f"{str(path)!r} holds {len(graphs)} graphs under {GRAPH_DIR}/ ({names}); name the file")
    return graphs[0]


def _written_for(graph: Path) -> str | None:
    """The CPU target a graph's metadata says its int8 weights were written for (None: none said)."""
    try:
        return read_props(graph).get(TARGET_KEY)
    except (OSError, ValueError, DecodeError):  # not there, or not ONNX: the graph's own checks say so, in a sentence
        return None


def folder_of(graph: Path) -> Path:
    """The model folder a graph belongs to: the parent of onnx/, else the graph's own folder."""
    graph = Path(graph)
    return graph.parent.parent if graph.parent.name == GRAPH_DIR else graph.parent


def lacks_tokenizer(source: Path) -> bool:
    """Whether the source has no tokenizer file: a folder without one cannot tokenize text."""
    return not any((Path(source) / n).is_file() for n in TOKENIZERS)
