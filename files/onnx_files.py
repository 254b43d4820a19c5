"""ONNX files: a graph saved with its weights beside it where one file cannot hold it (`save_onnx`: protobuf's
2 GB limit, which a 0.5B LM's graph passes), and its metadata (ModelProto.metadata_props) read and added without
parsing its graph, whose weights are most of the file: the file is walked field by field (protobuf's wire format:
a varint tag, then a varint, 8 or 4 bytes or a length and that many bytes), the graph's bytes skipped; props are
added by appending a message that holds only them, which protobuf merges into the file's (a repeated field's
entries are appended). A 0.5 GB LM's graph parsed and written again for one key held 2 copies of its weights.

Python's protobuf (upb) keeps a message's bytes in an arena that only grows until the whole message goes: a
weight replaced in place, or moved out to a file and read back in, leaves its old bytes behind. So a graph past
the limit is written tensor by tensor beside a skeleton that holds none of them, and the caller's graph is not
touched (a 0.5B LM's probes saved and read back this way held another copy of its 2.5 GB each). A graph within it
is written and read a weight at a time too (`save_onnx`, `load_onnx`): onnx's save serializes the whole message
first and its load reads the whole file before parsing it, twice a 0.5B LM's 2 GB at once.

A graph may be read with its weights left where they are (`load_lazy`): each weight of INLINE_BYTES or more a
reference to its bytes in the file (its place in the graph's own file, or in the file beside it), by its absolute
path, read when a writer takes it (`resolved`, `weight_array`); the writers here read each as they write it. A
writer that walks a 0.5B LM's graph a node at a time then holds what it makes, not the 2 GB it reads."""

import math
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx.external_data_helper import load_external_data_for_model

from compressor.errors import CompressorError

__all__ = [
    "read_props",
    "add_props",
    "save_onnx",
    "save_external",
    "load_onnx",
    "load_lazy",
    "is_lazy",
    "resolved",
    "weight_array",
    "Weights",
    "loaded",
    "WeightFile",
    "graph_pieces",
    "copy_fields",
    "TWO_GB",
]

PROPS_FIELD = 14  # ModelProto.metadata_props
GRAPH_FIELD = 7  # ModelProto.graph
INITIALIZER_FIELD = 5  # GraphProto.initializer
RAW_DATA_FIELD = 9  # TensorProto.raw_data
TWO_GB = 2**31  # protobuf's most bytes of one message
GRAPH_ROOM = 2**26  # what a graph holds beside its weights (nodes, names, metadata), at most
# A graph whose weights reach this keeps them in a file beside it, as past protobuf's limit: ONNX Runtime maps that file
# rather than parsing the weights and copying them (SmolLM2's fp32 graph, 0.54 GB: a session of 0.62 GiB with its
# packed weights, 0.83 from one file, which also held 0.59 GiB more while the session was made)
MAPPED_FROM = 2**28
INLINE_BYTES = 1024  # a tensor this small stays in the graph's file (onnx's own threshold)
ALIGN = 4096  # each weight beside it starts on a page, which ONNX Runtime can map rather than read
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


def _encode(value: int) -> bytes:
    """`value` as a varint."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _walk(f, name: str, end: int | None = None):
    """(field number, wire type, where its tag starts, where its value starts, the value's bytes) of each field of
    the message in the file `f` from its position to `end` (None: the file's end); the caller may read the value,
    the walk goes on after it."""
    while end is None or f.tell() < end:
        start = f.tell()
        tag = _varint(f)
        if tag is None:
            return
        field, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            _varint(f)
            size = 0
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
        elif wire == _LENGTH:
            size = _varint(f)
        else:
            raise ValueError(f"{name!r} is not an ONNX file (wire type {wire} at field {field})")
        value = f.tell()
        yield field, wire, start, value, size
        f.seek(value + size)


def read_props(path: str | Path) -> dict[str, str]:
    """key → value of the metadata props of the ONNX file at `path` (ValueError: not a protobuf message)."""
    props = {}
    with open(path, "rb") as f:
        for field, wire, _, _, size in _walk(f, str(path)):
            if field == PROPS_FIELD and wire == _LENGTH:
                entry = onnx.StringStringEntryProto.FromString(f.read(size))
                props[entry.key] = entry.value
    return props


def graph_pieces(path: str | Path, piece: int = 2**24):
    """The bytes of the ONNX file at `path` but its metadata props, as written, `piece` bytes at most at a time; then
    those of each file beside it that holds its weights, in the order the graph names them."""
    path = Path(path)
    with open(path, "rb") as f:
        for field, _, start, value, size in _walk(f, str(path)):
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


def _tensor(f, path: Path, value: int, size: int, weights: str) -> onnx.TensorProto:
    """The TensorProto of `size` bytes at `value` in the file `f` (at `path`): whole (`weights` "all"), without its
    raw bytes ("none"), or those of INLINE_BYTES or more left in the file, referred to by their place ("lazy")."""
    if weights == "all":
        return onnx.TensorProto.FromString(f.read(size))
    tensor, raw = onnx.TensorProto(), None
    for field, wire, start, at, length in _walk(f, str(path), value + size):
        if field == RAW_DATA_FIELD and wire == _LENGTH:
            raw = (at, length)
            continue
        f.seek(start)
        tensor.MergeFromString(f.read(at + length - start))
    if weights == "lazy" and raw is not None:
        if raw[1] < INLINE_BYTES:
            f.seek(raw[0])
            tensor.raw_data = f.read(raw[1])
        else:
            _refer(tensor, path.resolve(), *raw)
    return tensor


def _refer(tensor: onnx.TensorProto, where: Path, offset: int, length: int) -> None:
    """`tensor`'s values (its raw bytes) left at `offset` in the file `where`, `length` bytes."""
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", str(where)), ("offset", offset), ("length", length)):
        tensor.external_data.add(key=key, value=str(value))


def _read(path: Path, weights: str) -> onnx.ModelProto:
    """The ONNX file at `path` read a field at a time, each weight as `_tensor` reads it."""
    model = onnx.ModelProto()
    with open(path, "rb") as f:
        for field, wire, start, value, size in _walk(f, str(path)):
            if field != GRAPH_FIELD or wire != _LENGTH:
                f.seek(start)
                model.MergeFromString(f.read(value + size - start))
                continue
            for inner, inner_wire, inner_start, inner_value, inner_size in _walk(f, str(path), value + size):
                if inner == INITIALIZER_FIELD and inner_wire == _LENGTH:
                    model.graph.initializer.append(_tensor(f, path, inner_value, inner_size, weights))
                else:
                    f.seek(inner_start)
                    model.graph.MergeFromString(f.read(inner_value + inner_size - inner_start))
    return model


def load_onnx(path: str | Path, weights: bool = True) -> onnx.ModelProto:
    """The ONNX file at `path` read a field at a time, each weight parsed from its own bytes, those a file beside it
    holds read in (ValueError, DecodeError: not ONNX); not `weights`: the graph without its weights' values (their
    names, shapes, types and where a file beside it holds them remain; their bytes never read)."""
    path = Path(path)
    model = _read(path, "all" if weights else "none")
    if weights and any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        load_external_data_for_model(model, str(path.parent))
        for tensor in model.graph.initializer:
            tensor.ClearField("data_location")  # onnx sets it to DEFAULT: the tensor as a graph in one file holds it
    return model


def load_lazy(path: str | Path) -> onnx.ModelProto:
    """The ONNX file at `path` with each weight of INLINE_BYTES or more left where it is (`is_lazy`): in the graph's
    file or the one beside it, referred to by its absolute path, offset and length; for a writer that reads each
    as it takes it (`resolved`), and never for ONNX Runtime or onnx's own tools, which read none of them."""
    path = Path(path)
    model = _read(path, "lazy")
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL and not is_lazy(tensor):
            entries = {e.key: e.value for e in tensor.external_data}
            where = (path.parent / entries["location"]).resolve()
            if not where.is_relative_to(path.parent.resolve()):  # as onnx's own loader refuses it
                raise CompressorError(
                    f"{str(path)!r} keeps its weight {tensor.name!r} outside its folder ({entries['location']!r}); "
                    "ONNX's own loader refuses that too: put the weights file beside the graph"
                )
            offset = int(entries.get("offset", 0))
            _refer(tensor, where, offset, int(entries.get("length", os.path.getsize(where) - offset)))
    return model


def is_lazy(tensor: onnx.TensorProto) -> bool:
    """Whether `tensor`'s values are left in a file (`load_lazy`): its location an absolute path."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return False
    return any(e.key == "location" and os.path.isabs(e.value) for e in tensor.external_data)


def _place(tensor: onnx.TensorProto) -> tuple[str, int, int]:
    """(file, offset, length) of a lazy tensor's values."""
    entries = {e.key: e.value for e in tensor.external_data}
    return entries["location"], int(entries["offset"]), int(entries["length"])


def resolved(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """`tensor` with its values: itself, or a lazy one's copy with its bytes read from its file."""
    if not is_lazy(tensor):
        return tensor
    where, offset, length = _place(tensor)
    out = onnx.TensorProto()
    copy_fields(tensor, out, ("external_data", "data_location"))
    with open(where, "rb") as f:
        f.seek(offset)
        out.raw_data = f.read(length)
    return out


def weight_array(tensor: onnx.TensorProto) -> np.ndarray:
    """`tensor`'s values as an array of its own (a lazy one's read straight from its file)."""
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    if not is_lazy(tensor) or dtype.kind not in "biuf":
        return onnx.numpy_helper.to_array(resolved(tensor))
    where, offset, length = _place(tensor)
    return np.fromfile(where, dtype=dtype.newbyteorder("<"), count=length // dtype.itemsize, offset=offset).reshape(
        tuple(tensor.dims)
    )


class Weights(Mapping):
    """name → the values of each initializer of `graph` (weight_array), read again at each access: an LM's weights as
    arrays, all at once, were as large as its graph (2 GB at 0.5B), and each reader of two graphs made them."""

    def __init__(self, graph: onnx.GraphProto):
        self._inits = {i.name: i for i in graph.initializer}

    def __getitem__(self, name: str) -> np.ndarray:
        return weight_array(self._inits[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._inits)

    def __len__(self) -> int:
        return len(self._inits)


def loaded(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (changed in place) with each lazy weight's values read into it: for a tool that reads the whole
    graph (a lazy weight holds no bytes, so none are left behind)."""
    for tensor in model.graph.initializer:
        if is_lazy(tensor):
            tensor.CopyFrom(resolved(tensor))
    return model


class WeightFile:
    """A file that a graph's weights are written into as they are made (`add`), each then referred to as
    `load_lazy` refers to one: a graph built of them holds none of their bytes, and `save_onnx` reads each as it
    writes it (a 0.5B LM's graph built from its PyTorch weights held them twice)."""

    def __init__(self, path: Path):
        self.path = Path(path).resolve()
        self._file = open(self.path, "wb")  # noqa: SIM115 (closed by __exit__: a WeightFile is a context manager)

    def add(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        """`tensor` written into the file and referred to there (one under INLINE_BYTES as it is)."""
        if len(tensor.raw_data) < INLINE_BYTES:
            return tensor
        self._file.write(bytes(-self._file.tell() % ALIGN))
        offset = self._file.tell()
        length = self._file.write(tensor.raw_data)
        self._file.flush()
        lazy = onnx.TensorProto()
        copy_fields(tensor, lazy, ("raw_data",))
        _refer(lazy, self.path, offset, length)
        return lazy

    def __enter__(self) -> "WeightFile":
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()


def _lazy_size(tensor: onnx.TensorProto) -> int:
    """The bytes `resolved(tensor)` serializes to, its values not read."""
    if not is_lazy(tensor):
        return tensor.ByteSize()
    bare = onnx.TensorProto()
    copy_fields(tensor, bare, ("external_data", "data_location"))
    length = _place(tensor)[2]
    return bare.ByteSize() + len(_encode(RAW_DATA_FIELD << 3 | _LENGTH)) + len(_encode(length)) + length


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


def save_external(model: onnx.ModelProto, path: Path, initializers: Iterable[onnx.TensorProto] | None = None) -> None:
    """`model` at `path` with each of its graph's weights of INLINE_BYTES or more in PATH.data, written one at a
    time from `model` (not changed) into a skeleton that holds their places in the file; `initializers`: the graph's
    initializers one at a time, made as they are written, where `model` holds none."""
    skeleton = onnx.ModelProto()
    copy_fields(model, skeleton, ("graph",))
    copy_fields(model.graph, skeleton.graph, ("initializer",))
    location = f"{path.name}.data"
    with open(path.parent / location, "wb") as data:
        for tensor in model.graph.initializer if initializers is None else initializers:
            entry = skeleton.graph.initializer.add()
            if not is_lazy(tensor) and len(tensor.raw_data) < INLINE_BYTES:
                entry.CopyFrom(tensor)
                continue
            copy_fields(tensor, entry, ("raw_data", "external_data", "data_location"))
            data.write(bytes(-data.tell() % ALIGN))
            offset = data.tell()
            length = _copy_values(tensor, data) if is_lazy(tensor) else data.write(tensor.raw_data)
            entry.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", location), ("offset", offset), ("length", length)):
                entry.external_data.add(key=key, value=str(value))
    onnx.save_model(skeleton, str(path))


COPY_BYTES = 2**24  # a lazy weight's values copied from its file this many bytes at a time


def _copy_values(tensor: onnx.TensorProto, out) -> int:
    """A lazy tensor's values copied from its file into the open file `out`, a piece at a time: their length."""
    where, offset, length = _place(tensor)
    with open(where, "rb") as f:
        f.seek(offset)
        for at in range(0, length, COPY_BYTES):
            out.write(f.read(min(COPY_BYTES, length - at)))
    return length


def _write_tensor(tensor: onnx.TensorProto, out) -> None:
    """`tensor` serialized into the open file `out`, a lazy one's values copied from its file a piece at a time
    where they are its last field (as protobuf writes a weight's raw_data after its dims, type and name), not read
    whole: the bytes `resolved(tensor).SerializeToString()` makes."""
    if not is_lazy(tensor):
        out.write(tensor.SerializeToString())
        return
    bare = onnx.TensorProto()
    copy_fields(tensor, bare, ("external_data", "data_location"))
    if any(field.number > RAW_DATA_FIELD for field, _ in bare.ListFields()):
        out.write(resolved(tensor).SerializeToString())
        return
    out.write(bare.SerializeToString() + _encode(RAW_DATA_FIELD << 3 | _LENGTH) + _encode(_place(tensor)[2]))
    _copy_values(tensor, out)


def _save_inline(model: onnx.ModelProto, path: Path) -> None:
    """`model` at `path` as onnx.save_model writes it, but a weight serialized at a time: the model's fields, then
    its graph's beside its initializers, then each initializer, a lazy one read as it is written (protobuf reads a
    message's fields in any order)."""
    skeleton, graph = onnx.ModelProto(), onnx.GraphProto()
    copy_fields(model, skeleton, ("graph",))
    copy_fields(model.graph, graph, ("initializer",))
    head = graph.SerializeToString()
    tag = _encode(INITIALIZER_FIELD << 3 | _LENGTH)
    sizes = [_lazy_size(tensor) for tensor in model.graph.initializer]
    total = len(head) + sum(len(tag) + len(_encode(size)) + size for size in sizes)
    with open(path, "wb") as f:
        f.write(skeleton.SerializeToString())
        f.write(_encode(GRAPH_FIELD << 3 | _LENGTH) + _encode(total) + head)
        for tensor, size in zip(model.graph.initializer, sizes):
            f.write(tag + _encode(size))
            _write_tensor(tensor, f)


def save_onnx(model: onnx.ModelProto, path: str | Path) -> None:
    """`model` saved at `path` a weight at a time; where the graph passes protobuf's limit or MAPPED_FROM, its
    weights in one file beside it (PATH.data, as the exporter does, which every reader of ONNX follows); `model`
    itself unchanged."""
    path = Path(path)
    weights = _weight_bytes(model)
    if weights < MAPPED_FROM and weights + GRAPH_ROOM <= TWO_GB:
        _save_inline(model, path)
    else:
        save_external(model, path)
