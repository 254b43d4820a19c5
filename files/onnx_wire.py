"""Protobuf's wire format, which an ONNX file is, walked a field at a time: each field a varint tag (its number
<< 3 | its wire type), then a varint, 8 or 4 bytes, or a length and that many bytes; and a message's fields copied
one by one. Reading a file's fields this way skips a graph's weights (most of the file) or takes them one at a
time, where protobuf's own parser reads the whole file first."""

from google.protobuf.message import Message

__all__ = [
    "PROPS_FIELD",
    "GRAPH_FIELD",
    "INITIALIZER_FIELD",
    "RAW_DATA_FIELD",
    "VARINT",
    "FIXED64",
    "LENGTH",
    "FIXED32",
    "read_varint",
    "encode_varint",
    "walk",
    "copy_fields",
]

PROPS_FIELD = 14  # ModelProto.metadata_props
GRAPH_FIELD = 7  # ModelProto.graph
INITIALIZER_FIELD = 5  # GraphProto.initializer
RAW_DATA_FIELD = 9  # TensorProto.raw_data
VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5  # the wire types an ONNX file uses


def read_varint(f) -> int | None:
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


def encode_varint(value: int) -> bytes:
    """`value` as a varint."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def walk(f, name: str, end: int | None = None):
    """(field number, wire type, where its tag starts, where its value starts, the value's bytes) of each field of
    the message in the file `f` from its position to `end` (None: the file's end); the caller may read the value,
    the walk goes on after it."""
    while end is None or f.tell() < end:
        start = f.tell()
        tag = read_varint(f)
        if tag is None:
            return
        field, wire = tag >> 3, tag & 7
        if wire == VARINT:
            read_varint(f)
            size = 0
        elif wire in (FIXED64, FIXED32):
            size = 8 if wire == FIXED64 else 4
        elif wire == LENGTH:
            size = read_varint(f)
        else:
            raise ValueError(f"{name!r} is not an ONNX file (wire type {wire} at field {field})")
        value = f.tell()
        yield field, wire, start, value, size
        f.seek(value + size)


def copy_fields(src: Message, dst: Message, skip: tuple[str, ...]) -> None:
    """Every field of `src` set in `dst` but those named in `skip` (a repeated field's entries appended)."""
    for field, value in src.ListFields():
        if field.name in skip:
            continue
        if field.is_repeated:
            getattr(dst, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)
