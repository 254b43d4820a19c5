"""A graph's weight left in its file: a TensorProto that holds no bytes but where they are, as external data by the
file's absolute path, its offset and length (`refer`, `is_lazy`), read when a writer takes it (`resolved`,
`weight_array`, `Weights`, `loaded`) or copied a piece at a time (`copy_values`). `load_lazy` reads a graph so;
`WeightFile` writes weights into a file as they are made and refers to them so. A writer that walks a 0.5B LM's
graph a node at a time then holds what it makes, not the 2 GB it reads; a graph built of a WeightFile's weights
holds none of their bytes.

Only the writers here read such a tensor: ONNX Runtime and onnx's own tools read none of its values."""

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import onnx

from files.onnx_wire import copy_fields

__all__ = [
    "INLINE_BYTES",
    "ALIGN",
    "refer",
    "is_lazy",
    "place",
    "resolved",
    "weight_array",
    "weight_range",
    "copy_values",
    "Weights",
    "loaded",
    "WeightFile",
    "write_values",
    "bare_tensor",
]

INLINE_BYTES = 1024  # a tensor this small stays in the graph's file (onnx's own threshold)
ALIGN = 4096  # each weight beside it starts on a page, which ONNX Runtime can map rather than read
COPY_BYTES = 2**24  # a lazy weight's values copied from its file this many bytes at a time


def refer(tensor: onnx.TensorProto, where: Path, offset: int, length: int) -> None:
    """`tensor`'s values (its raw bytes) left at `offset` in the file `where`, `length` bytes."""
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", str(where)), ("offset", offset), ("length", length)):
        tensor.external_data.add(key=key, value=str(value))


def is_lazy(tensor: onnx.TensorProto) -> bool:
    """Whether `tensor`'s values are left in a file (`load_lazy`): its location an absolute path."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return False
    return any(e.key == "location" and os.path.isabs(e.value) for e in tensor.external_data)


def place(tensor: onnx.TensorProto) -> tuple[str, int, int]:
    """(file, offset, length) of a lazy tensor's values."""
    entries = {e.key: e.value for e in tensor.external_data}
    return entries["location"], int(entries["offset"]), int(entries["length"])


def resolved(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """`tensor` with its values: itself, or a lazy one's copy with its bytes read from its file."""
    if not is_lazy(tensor):
        return tensor
    where, offset, length = place(tensor)
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
    where, offset, length = place(tensor)
    return np.fromfile(where, dtype=dtype.newbyteorder("<"), count=length // dtype.itemsize, offset=offset).reshape(
        tuple(tensor.dims)
    )


def weight_range(tensor: onnx.TensorProto) -> tuple[float, float]:
    """(min, max) of a numeric `tensor`'s values, a lazy one's read COPY_BYTES at a time (a 262,144-row table's range
    taken while a slice of it is held: not a second copy of it)."""
    if not is_lazy(tensor):
        array = weight_array(tensor)
        return float(array.min()), float(array.max())
    where, offset, length = place(tensor)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).newbyteorder("<")
    step = COPY_BYTES // dtype.itemsize
    low, high = np.inf, -np.inf
    for at in range(0, length // dtype.itemsize, step):
        count = min(step, length // dtype.itemsize - at)
        piece = np.fromfile(where, dtype=dtype, count=count, offset=offset + at * dtype.itemsize)
        low, high = min(low, float(piece.min())), max(high, float(piece.max()))
    return low, high


def copy_values(tensor: onnx.TensorProto, out) -> int:
    """A lazy tensor's values copied from its file into the open file `out`, a piece at a time: their length."""
    where, offset, length = place(tensor)
    with open(where, "rb") as f:
        f.seek(offset)
        for at in range(0, length, COPY_BYTES):
            out.write(f.read(min(COPY_BYTES, length - at)))
    return length


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


def write_values(array: np.ndarray, out) -> int:
    """`array`'s values, as a tensor stores them (C order, little-endian), written into the open file `out` COPY_BYTES
    at a time, each piece copied only where the array is not so already (a transposed view): their length. A
    TensorProto made of an array first holds a copy of all its bytes (a 262,144-row table: 0.67 GB more at a peak)."""
    stored = array.dtype.newbyteorder("<")
    if array.ndim == 0:
        return out.write(np.ascontiguousarray(array, dtype=stored).data)
    rows = max(1, COPY_BYTES // max(1, array[:1].nbytes))
    return sum(
        out.write(np.ascontiguousarray(array[at : at + rows], dtype=stored).data) for at in range(0, len(array), rows)
    )


def bare_tensor(name: str, array: np.ndarray) -> onnx.TensorProto:
    """The initializer `name` of `array`'s shape and type, without its values (written elsewhere: write_values)."""
    return onnx.TensorProto(name=name, dims=array.shape, data_type=onnx.helper.np_dtype_to_tensor_dtype(array.dtype))


class WeightFile:
    """A file that a graph's weights are written into as they are made (`add`), each then referred to as
    `load_lazy` refers to one: a graph built of them holds none of their bytes, and `save_onnx` reads each as it
    writes it (a 0.5B LM's graph built from its PyTorch weights held them twice)."""

    def __init__(self, path: Path):
        self.path = Path(path).resolve()
        self._file = open(self.path, "wb")  # noqa: SIM115 (closed by __exit__: a WeightFile is a context manager)

    def add(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        """`tensor` written into the file and referred to there (one under INLINE_BYTES as it is)."""
        raw = tensor.raw_data
        if len(raw) < INLINE_BYTES:
            return tensor
        lazy = onnx.TensorProto()
        copy_fields(tensor, lazy, ("raw_data",))
        refer(lazy, self.path, *self._written(raw))
        return lazy

    def add_array(self, name: str, array: np.ndarray) -> onnx.TensorProto:
        """`array`'s values written into the file (write_values) and referred to there as the initializer `name`
        (one under INLINE_BYTES in the graph)."""
        if array.nbytes < INLINE_BYTES:
            return onnx.numpy_helper.from_array(np.ascontiguousarray(array), name)
        lazy = bare_tensor(name, array)
        refer(lazy, self.path, *self._written(array))
        return lazy

    def _written(self, values: bytes | np.ndarray) -> tuple[int, int]:
        """`values` (bytes, or an array's: write_values) written at the file's next page: (offset, length)."""
        self._file.write(bytes(-self._file.tell() % ALIGN))
        offset = self._file.tell()
        length = write_values(values, self._file) if isinstance(values, np.ndarray) else self._file.write(values)
        self._file.flush()
        return offset, length

    def __enter__(self) -> "WeightFile":
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()
