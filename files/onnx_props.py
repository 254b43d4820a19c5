"""An ONNX file's metadata (ModelProto.metadata_props) read and added without parsing its graph, whose weights
are most of the file: the file is walked field by field (protobuf's wire format: a varint tag, then a varint, 8 or
4 bytes or a length and that many bytes), the graph's bytes skipped; props are added by appending a message that
holds only them, which protobuf merges into the file's (a repeated field's entries are appended). A 0.5 GB LM's
graph parsed and written again for one key held 2 copies of its weights at once."""

from pathlib import Path

import onnx

__all__ = ["read_props", "add_props"]

PROPS_FIELD = 14  # ModelProto.metadata_props
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
