"""An ONNX file's metadata (ModelProto.metadata_props) read and added without parsing its graph, whose weights are
most of the file: the file is walked field by field (files.onnx_wire), the graph's bytes skipped; props are added
by appending a message that holds only them, which protobuf merges into the file's (a repeated field's entries are
appended). A 0.5 GB LM's graph parsed and written again for one key held 2 copies of its weights. And the file's
bytes but its metadata, a piece at a time (`graph_pieces`: what a graph is, whatever its metadata says)."""

from pathlib import Path

import onnx

from files.onnx_load import load_onnx
from files.onnx_wire import LENGTH, PROPS_FIELD, walk

__all__ = ["read_props", "add_props", "graph_pieces"]


def read_props(path: str | Path) -> dict[str, str]:
    """key → value of the metadata props of the ONNX file at `path` (ValueError: not a protobuf message)."""
    props = {}
    with open(path, "rb") as f:
        for field, wire, _, _, size in walk(f, str(path)):
            if field == PROPS_FIELD and wire == LENGTH:
                entry = onnx.StringStringEntryProto.FromString(f.read(size))
                props[entry.key] = entry.value
    return props


def add_props(path: str | Path, props: dict[str, str]) -> None:
    """`props` added to the metadata of the ONNX file at `path`, in place; a key it holds already is refused
    (ValueError: ONNX's checker refuses a file whose metadata names a key twice)."""
    held = read_props(path)
    twice = sorted(set(held) & set(props))
    if twice:
        raise ValueError(f"{str(path)!r} holds the metadata key {twice[0]!r} already")
    extra = onnx.ModelProto()
    extra.metadata_props.extend(onnx.StringStringEntryProto(key=k, value=str(v)) for k, v in props.items())
    with open(path, "ab") as f:
        f.write(extra.SerializeToString())


def graph_pieces(path: str | Path, piece: int = 2**24):
    """The bytes of the ONNX file at `path` but its metadata props, as written, `piece` bytes at most at a time; then
    those of each file beside it that holds its weights, in the order the graph names them."""
    path = Path(path)
    with open(path, "rb") as f:
        for field, _, start, value, size in walk(f, str(path)):
            if field == PROPS_FIELD:
                continue
            f.seek(start)
            for at in range(start, value + size, piece):
                yield f.read(min(piece, value + size - at))
    tensors = load_onnx(path, weights=False).graph.initializer
    for location in dict.fromkeys(e.value for t in tensors for e in t.external_data if e.key == "location"):
        with open(path.parent / location, "rb") as f:
            while chunk := f.read(piece):
                yield chunk
