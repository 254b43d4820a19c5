"""ONNX files: a graph saved with its weights beside it where one file cannot hold it (`save_onnx`: protobuf's
2 GB limit, which a 0.5B LM's graph passes), and its metadata (ModelProto.metadata_props) read and added without
parsing its graph, whose weights are most of the file: the file is walked field by field (protobuf's wire format:
a varint tag, then a varint, 8 or 4 bytes or a length and that many bytes), the graph's bytes skipped; props are
added by appending a message that holds only them, which protobuf merges into the file's (a repeated field's
entries are appended). A 0.5 GB LM's graph parsed and written again for one key held 2 copies of its weights."""

import math
from pathlib import Path

import onnx
from onnx.external_data_helper import load_external_data_for_model

__all__ = ["read_props", "add_props", "save_onnx", "TWO_GB"]

PROPS_FIELD = 14  # ModelProto.metadata_props
TWO_GB = 2**31  # protobuf's most bytes of one message
GRAPH_ROOM = 2**26  # what a graph holds beside its weights (nodes, names, metadata), at most
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def _varint(f) -> int | None:
    """The next varint of the file `f`, None at its end."""
    value, shift = 0, 0
    while True:
        byte = f.read(1)
        if not byte:
            if shift:
                raise ValueError("the file ends inside a field")
            return None
        value |= (byte[0] & 0x7F) << shift
        shift += 7
        if byte[0] < 0x80:
            return value


def read_props(path: str | Path) -> dict[str, str]:
    """key → value of the metadata props of the ONNX file at `path` (ValueError: not a protobuf message)."""
    props = {}
    with open(path, "rb") as f:
        while (tag := _varint(f)) is not None:
            field, wire = tag >> 3, tag & 7
            if wire == _VARINT:
                _varint(f)
            elif wire in (_FIXED64, _FIXED32):
                f.seek(8 if wire == _FIXED64 else 4, 1)
            elif wire == _LENGTH:
                size = _varint(f)
                if field == PROPS_FIELD:
                    entry = onnx.StringStringEntryProto.FromString(f.read(size))
                    props[entry.key] = entry.value
                else:
                    f.seek(size, 1)
            else:
                raise ValueError(f"{str(path)!r} is not an ONNX file (wire type {wire} at field {field})")
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


def _weight_bytes(model: onnx.ModelProto) -> int:
    """The bytes of the graph's initializers, from their shapes (protobuf cannot size a message past its limit)."""
    return sum(
        math.prod(t.dims) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize for t in model.graph.initializer
    )


def save_onnx(model: onnx.ModelProto, path: str | Path) -> None:
    """`model` saved at `path`; where the graph passes protobuf's limit, its weights in one file beside it (PATH.data,
    as the exporter does, which every reader of ONNX follows) and read back into `model`, which the caller may use."""
    path = Path(path)
    if _weight_bytes(model) + GRAPH_ROOM <= TWO_GB:
        onnx.save_model(model, str(path))
        return
    onnx.save_model(model, str(path), save_as_external_data=True, location=f"{path.name}.data")
    load_external_data_for_model(model, str(path.parent))  # saving moved the weights out of `model`
