"""Each MatMul quantized from a graph of that MatMul and its weight alone (`alone`), one weight's copies at a time,
into a new graph (`each_matmul`), a wide weight a slice of its columns at a time (`sliced`): ONNX Runtime's
quantizer given a whole graph held ~3 copies of it, and its k-quant ~11× the weight it is given."""

import collections
from collections.abc import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from compressor.errors import CompressorError
from files.onnx_files import copy_fields

__all__ = ["SLICE_BYTES", "Quantizer", "alone", "each_matmul", "sliced"]

SLICE_BYTES = 2**26  # the fp32 bytes of a weight's columns the quantizer is given at a time (each_matmul)


def alone(model: onnx.ModelProto, node: onnx.NodeProto, weight: onnx.TensorProto | None = None) -> onnx.ModelProto:
    """A graph of `model`'s MatMul `node` and its constant `weight` (None: found in `model`) alone, copied: what a
    quantizer takes one layer at a time."""
    if weight is None:
        weight = next(i for i in model.graph.initializer if i.name == node.input[1])
    graph = onnx.helper.make_graph(
        [node],
        "one",
        [onnx.helper.make_tensor_value_info(node.input[0], onnx.TensorProto.FLOAT, None)],
        [onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None)],
        [weight],
    )
    return onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)


Quantizer = Callable[[onnx.ModelProto], onnx.ModelProto]  # ONNX Runtime's, on a graph of one MatMul


def each_matmul(model: onnx.ModelProto, chosen: dict[str, Quantizer]) -> onnx.ModelProto:
    """A new graph: `model` with each MatMul node named in `chosen` replaced by what its quantizer (ONNX Runtime's)
    makes of a graph of that node and its weight alone (`sliced`): its nodes in the node's place, its initializers
    added, the fp32 weight dropped where no other node reads it. One weight's copies at a time: the quantizer given
    the whole graph held ~3 copies of it (SmolLM2: 2.7 GB for 0.54 GB of weights); built anew, not changed in place
    (a protobuf message keeps the bytes of what it drops: files.onnx_files)."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    uses = collections.Counter(name for node in graph.node for name in node.input)
    nodes, added, dropped, domains = [], [], set(), {}
    for node in graph.node:
        if node.name not in chosen:
            nodes.append(node)
            continue
        weight = inits[node.input[1]]
        done = sliced(model, node, weight, chosen[node.name])
        nodes.extend(done.graph.node)
        added.extend(i for i in done.graph.initializer if i.name != weight.name)
        domains.update({o.domain: o.version for o in done.opset_import})
        uses[weight.name] -= 1
        if not uses[weight.name]:
            dropped.add(weight.name)
    out = onnx.ModelProto()
    copy_fields(model, out, ("graph",))
    copy_fields(graph, out.graph, ("node", "initializer"))
    out.graph.node.extend(nodes)
    out.graph.initializer.extend([*(i for i in graph.initializer if i.name not in dropped), *added])
    held = {o.domain for o in out.opset_import}
    out.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in domains.items() if d not in held)
    return out


def sliced(
    model: onnx.ModelProto,
    node: onnx.NodeProto,
    weight: onnx.TensorProto,
    quantized: Quantizer,
) -> onnx.ModelProto:
    """What `quantized` makes of `model`'s MatMul `node` and its `weight` (K × N) alone; a weight past SLICE_BYTES a
    slice of its columns at a time, the MatMulNBits slices joined along N (a column's blocks are rounded alone, so
    the codes, scales and zero points are the whole weight's): ONNX Runtime's k-quant holds some 11× the weight it is
    given (Qwen2.5-0.5B's 151,936-column head: 6 GB)."""
    k, n = weight.dims
    step = max(1, SLICE_BYTES // (4 * k))
    if n <= step:
        return quantized(alone(model, node, weight))
    array = numpy_helper.to_array(weight)
    columns = (np.ascontiguousarray(array[:, at : at + step]) for at in range(0, n, step))
    parts = [quantized(alone(model, node, numpy_helper.from_array(part, weight.name))) for part in columns]
    first = parts[0]
    (joined,) = first.graph.node
    if joined.op_type != "MatMulNBits":
        raise CompressorError(f"a slice of {node.name!r} was quantized into {joined.op_type}, not MatMulNBits")
    for attribute in joined.attribute:
        if attribute.name == "N":
            attribute.i = n
    pieces = {i.name: [numpy_helper.to_array(i)] for i in first.graph.initializer if i.name != weight.name}
    for part in parts[1:]:
        for tensor in part.graph.initializer:
            if tensor.name in pieces:
                pieces[tensor.name].append(numpy_helper.to_array(tensor))
    one = onnx.ModelProto()
    copy_fields(first, one, ("graph",))
    copy_fields(first.graph, one.graph, ("initializer",))
    one.graph.initializer.extend(numpy_helper.from_array(np.concatenate(p), name) for name, p in pieces.items())
    return one
