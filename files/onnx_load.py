"""An ONNX file read a field at a time (`load_onnx`), each weight parsed from its own bytes: onnx's load reads the
whole file before parsing it, which held twice a 0.5B LM's 2 GB at once. Or read with its weights left where they
are (`load_lazy`): each weight of INLINE_BYTES or more a reference to its bytes in the file (its place in the
graph's own file, or in the file beside it), read when a writer takes it (files.lazy_weights)."""

import os
from pathlib import Path

import onnx
from onnx.external_data_helper import load_external_data_for_model

from compressor.errors import CompressorError
from files.lazy_weights import INLINE_BYTES, is_lazy, refer
from files.onnx_wire import GRAPH_FIELD, INITIALIZER_FIELD, LENGTH, RAW_DATA_FIELD, walk

__all__ = ["load_onnx", "load_lazy"]


def _tensor(f, path: Path, value: int, size: int, weights: str) -> onnx.TensorProto:
    """The TensorProto of `size` bytes at `value` in the file `f` (at `path`): whole (`weights` "all"), without its
    raw bytes ("none"), or those of INLINE_BYTES or more left in the file, referred to by their place ("lazy")."""
    if weights == "all":
        return onnx.TensorProto.FromString(f.read(size))
    tensor, raw = onnx.TensorProto(), None
    for field, wire, start, at, length in walk(f, str(path), value + size):
        if field == RAW_DATA_FIELD and wire == LENGTH:
            raw = (at, length)
            continue
        f.seek(start)
        tensor.MergeFromString(f.read(at + length - start))
    if weights == "lazy" and raw is not None:
        if raw[1] < INLINE_BYTES:
            f.seek(raw[0])
            tensor.raw_data = f.read(raw[1])
        else:
            refer(tensor, path.resolve(), *raw)
    return tensor


def _read(path: Path, weights: str) -> onnx.ModelProto:
    """The ONNX file at `path` read a field at a time, each weight as `_tensor` reads it."""
    model = onnx.ModelProto()
    with open(path, "rb") as f:
        for field, wire, start, value, size in walk(f, str(path)):
            if field != GRAPH_FIELD or wire != LENGTH:
                f.seek(start)
                model.MergeFromString(f.read(value + size - start))
                continue
            for inner, inner_wire, inner_start, inner_value, inner_size in walk(f, str(path), value + size):
                if inner == INITIALIZER_FIELD and inner_wire == LENGTH:
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
            refer(tensor, where, offset, int(entries.get("length", os.path.getsize(where) - offset)))
    return model
