"""An ONNX graph written a weight at a time (`save_onnx`), the caller's graph not touched: onnx's save serializes
the whole message first, which held twice a 0.5B LM's 2 GB at once. Where the graph passes protobuf's 2 GB limit
(which a 0.5B LM's graph does) or MAPPED_FROM, its weights go into one file beside it (`save_external`), each on a
page, beside a skeleton that holds their places; a lazy weight (files.lazy_weights) is read as it is written.

Python's protobuf (upb) keeps a message's bytes in an arena that only grows until the whole message goes: a
weight replaced in place, or moved out to a file and read back in, leaves its old bytes behind. So the graph is
written tensor by tensor (a 0.5B LM's probes saved and read back by moving their weights out held another copy of
its 2.5 GB each)."""

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx

from files.lazy_weights import (
    ALIGN,
    INLINE_BYTES,
    bare_tensor,
    copy_values,
    is_lazy,
    place,
    resolved,
    write_values,
)
from files.onnx_wire import GRAPH_FIELD, INITIALIZER_FIELD, LENGTH, RAW_DATA_FIELD, copy_fields, encode_varint

__all__ = ["save_onnx", "save_external", "TWO_GB", "MAPPED_FROM"]

TWO_GB = 2**31  # protobuf's most bytes of one message
GRAPH_ROOM = 2**26  # what a graph holds beside its weights (nodes, names, metadata), at most
# A graph whose weights reach this keeps them in a file beside it, as past protobuf's limit: ONNX Runtime maps that file
# rather than parsing the weights and copying them (SmolLM2's fp32 graph, 0.54 GB: a session of 0.62 GiB with its
# packed weights, 0.83 from one file, which also held 0.59 GiB more while the session was made; its w8 row, 0.15 GB:
# 0.27 GiB mapped, 0.35 from one file)
MAPPED_FROM = 2**27


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


def save_external(
    model: onnx.ModelProto,
    path: Path,
    initializers: Iterable[onnx.TensorProto | tuple[str, np.ndarray]] | None = None,
) -> None:
    """`model` at `path` with each of its graph's weights of INLINE_BYTES or more in PATH.data, written one at a
    time from `model` (not changed) into a skeleton that holds their places in the file; `initializers`: the graph's
    initializers one at a time, made as they are written, where `model` holds none: each a TensorProto or a (name,
    array) pair, written from the array (files.lazy_weights.write_values)."""
    skeleton = onnx.ModelProto()
    copy_fields(model, skeleton, ("graph",))
    copy_fields(model.graph, skeleton.graph, ("initializer",))
    location = f"{path.name}.data"
    with open(path.parent / location, "wb") as data:
        for tensor in model.graph.initializer if initializers is None else initializers:
            values = tensor[1] if isinstance(tensor, tuple) else None
            if values is not None and values.nbytes < INLINE_BYTES:
                tensor, values = onnx.numpy_helper.from_array(np.ascontiguousarray(values), tensor[0]), None
            elif values is not None:
                tensor = bare_tensor(tensor[0], values)
            entry = skeleton.graph.initializer.add()
            if values is None and not is_lazy(tensor) and len(tensor.raw_data) < INLINE_BYTES:
                entry.CopyFrom(tensor)
                continue
            copy_fields(tensor, entry, ("raw_data", "external_data", "data_location"))
            data.write(bytes(-data.tell() % ALIGN))
            offset = data.tell()
            if values is not None:
                length = write_values(values, data)
            else:
                length = copy_values(tensor, data) if is_lazy(tensor) else data.write(tensor.raw_data)
            entry.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", location), ("offset", offset), ("length", length)):
                entry.external_data.add(key=key, value=str(value))
    onnx.save_model(skeleton, str(path))


def _weight_bytes(model: onnx.ModelProto) -> int:
    """The bytes of the graph's initializers, from their shapes (protobuf cannot size a message past its limit)."""
    return sum(
        math.prod(t.dims) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize for t in model.graph.initializer
    )


def _lazy_size(tensor: onnx.TensorProto) -> int:
    """The bytes `resolved(tensor)` serializes to, its values not read."""
    if not is_lazy(tensor):
        return tensor.ByteSize()
    bare = onnx.TensorProto()
    copy_fields(tensor, bare, ("external_data", "data_location"))
    length = place(tensor)[2]
    return bare.ByteSize() + len(encode_varint(RAW_DATA_FIELD << 3 | LENGTH)) + len(encode_varint(length)) + length


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
    out.write(bare.SerializeToString() + encode_varint(RAW_DATA_FIELD << 3 | LENGTH) + encode_varint(place(tensor)[2]))
    copy_values(tensor, out)


def _save_inline(model: onnx.ModelProto, path: Path) -> None:
    """`model` at `path` as onnx.save_model writes it, but a weight serialized at a time: the model's fields, then
    its graph's beside its initializers, then each initializer, a lazy one read as it is written (protobuf reads a
    message's fields in any order)."""
    skeleton, graph = onnx.ModelProto(), onnx.GraphProto()
    copy_fields(model, skeleton, ("graph",))
    copy_fields(model.graph, graph, ("initializer",))
    head = graph.SerializeToString()
    tag = encode_varint(INITIALIZER_FIELD << 3 | LENGTH)
    sizes = [_lazy_size(tensor) for tensor in model.graph.initializer]
    total = len(head) + sum(len(tag) + len(encode_varint(size)) + size for size in sizes)
    with open(path, "wb") as f:
        f.write(skeleton.SerializeToString())
        f.write(encode_varint(GRAPH_FIELD << 3 | LENGTH) + encode_varint(total) + head)
        for tensor, size in zip(model.graph.initializer, sizes):
            f.write(tag + encode_varint(size))
            _write_tensor(tensor, f)
