"""What an ONNX file holds: bytes on disk, weights, and the initializer bytes of the graph as
ONNX Runtime optimised it (constant folding may turn small factors into a dense matrix)."""

import functools
import tempfile
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from compressor.errors import CompressorError
from eval.memory import trim_heap
from eval.probe import session_options
from files.onnx_files import load_onnx

__all__ = [
    "load_graph",
    "file_bytes",
    "initializer_stats",
    "optimized_initializer_bytes",
    "make_session",
    "runtime_errors",
]


def runtime_errors() -> tuple[type[Exception], ...]:
    """What ONNX Runtime raises when a session cannot run a graph (its errors derive from Exception alone)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return (state.Fail, state.InvalidArgument, state.RuntimeException, state.InvalidGraph, state.NotImplemented)


def load_graph(path: str | Path, with_data: bool = True) -> onnx.ModelProto:
    """The ONNX model at `path` (files.onnx_files.load_onnx; not `with_data`: without its weights' values, for what
    its nodes, inputs, outputs, metadata and weights' shapes say), or one clear error if it is missing or not ONNX."""
    path = Path(path)
    if not path.is_file():
        raise CompressorError(f"ONNX file {str(path)!r} does not exist")
    try:
        return load_onnx(path, weights=with_data)
    except (DecodeError, ValueError, OSError) as e:  # what a file that is not ONNX raises
        raise CompressorError(f"{str(path)!r} is not an ONNX model ({type(e).__name__}: {e})") from None


def file_bytes(path: str | Path) -> int:
    """Size of the ONNX file plus the external-data files it references."""
    path = Path(path)
    model = load_graph(path, with_data=False)
    extra = {entry.value for init in model.graph.initializer for entry in init.external_data if entry.key == "location"}
    return path.stat().st_size + sum((path.parent / loc).stat().st_size for loc in extra)


def initializer_stats(model: onnx.ModelProto) -> tuple[int, int]:
    """(elements, bytes) of every initializer in the graph."""
    elements = total = 0
    for init in model.graph.initializer:
        n = int(np.prod(init.dims)) if init.dims else 1
        elements += n
        total += n * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
    return elements, total


def make_session(
    path: str | Path,
    threads: int = 1,
    arena: bool = True,
    optimized_path: Path | None = None,
    spin: bool = True,
    prepack: bool = True,
):
    """An ONNX Runtime CPU session with the settings of probe.session_options (the heap trimmed first: what earlier
    sessions freed given back, eval.memory.trim_heap)."""
    import onnxruntime as ort

    options = session_options(threads, arena, optimized_path, spin, prepack)
    if not Path(path).is_file():
        raise CompressorError(f"ONNX file {str(path)!r} does not exist")
    trim_heap()
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except (
        ort.capi.onnxruntime_pybind11_state.InvalidProtobuf,
        ort.capi.onnxruntime_pybind11_state.Fail,
    ) as e:
        first = str(e).strip().splitlines()[0]
        raise CompressorError(f"ONNX Runtime cannot load {str(path)!r}: {first}") from None


# Operators whose kernels read the copies of their weights they packed as the session was made: without them they
# repack at each call (SmolLM2's int4 graph 21 % slower at (4, 128), its int8 31 %)
PACKING_OPS = frozenset({"MatMulNBits", "MatMulInteger", "DynamicQuantizeMatMul", "QLinearMatMul"})


def numbers_session(path: str | Path, threads: int = 2, arena: bool = True):
    """A session whose outputs are read, not timed: a graph of float weights without the packed copies of its
    MatMul weights (SmolLM2's fp32 graph: 0.53 GiB over the libraries, 0.85 with them, 3–5 % slower), a quantized
    one with its kernels' (PACKING_OPS); `arena` False: what a run allocates given back after it (session_options)."""
    graph = Path(path)
    if not graph.is_file():
        raise CompressorError(f"ONNX file {str(path)!r} does not exist")
    stat = graph.stat()
    packs = _packs(str(graph.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    return make_session(path, threads=threads, arena=arena, prepack=packs)


@functools.lru_cache(maxsize=256)
def _packs(path: str, inode: int, size: int, mtime_ns: int) -> bool:
    """Whether the graph at `path` has an operator of PACKING_OPS: read once for each file written there (a file
    written in its place, by another inode, size or time, is read again)."""
    ops = {node.op_type for node in load_graph(path, with_data=False).graph.node}
    return not ops.isdisjoint(PACKING_OPS)


def optimized_initializer_bytes(path: str | Path) -> int:
    """Initializer bytes of the graph after ONNX Runtime's optimisations."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "optimized.onnx"
        make_session(path, optimized_path=out)
        return initializer_stats(load_graph(out, with_data=False))[1]  # its weights may stay beside the source
