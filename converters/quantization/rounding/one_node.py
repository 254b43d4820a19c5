"""Each node a quantizer rounds, quantized from a graph of that node and the stored weights it reads alone
(`alone`), one weight's copies at a time, into a new graph (`each_node`); a wide weight a slice at a time
(`sliced`: a MatMul's columns, a Gather's rows), where its slices round as the whole does. ONNX Runtime's quantizers
given a whole graph hold copies of it: its 4-bit one ~3 (SmolLM2: 2.7 GB for 0.54 GB of weights),
`quantize_dynamic` ~4 (Qwen2.5-0.5B's shape: 7.8 GB above the process for 2 GB), and 5× (per tensor) to 11×
(k-quant) the weight they are given. The graph given may leave its weights in their file (files.onnx_files.load_lazy):
each is read as its node is quantized, and those no quantizer takes stay where they are."""

import collections
from collections.abc import Callable

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import numpy_helper
from tqdm.auto import tqdm

from compressor.errors import CompressorError
from files.onnx_files import copy_fields, is_lazy, resolved, weight_array

__all__ = ["SLICE_BYTES", "WEIGHT_INPUT", "Quantizer", "alone", "each_node", "sliced", "groups", "with_shapes"]

# the fp32 bytes of a weight's columns (or rows) the quantizer is given at a time (each_node): ONNX Runtime's 4-bit
# quantizer held 11× its slice (SmolLM2's head in 64 MB slices: 0.7 GB above the process), its int8 one 5×
SLICE_BYTES = 2**24
WEIGHT_INPUT = {"MatMul": 1, "Gather": 0}  # the input of an operator a wide stored weight is, which may be sliced
SHAPE_BYTES = 2**16  # a stored tensor this large is a weight, whose values shape inference does not read


def _types(graph: onnx.GraphProto) -> dict[str, int]:
    """Tensor name → element type, of those `graph` types (its inputs, outputs and value_info)."""
    return {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.output, *graph.value_info)}


def alone(model: onnx.ModelProto, *nodes: onnx.NodeProto, weight: onnx.TensorProto | None = None) -> onnx.ModelProto:
    """A graph of `model`'s `nodes` alone, copied, with the stored weights they read (`weight` in place of the one
    of its name): what a quantizer takes a layer at a time. Its inputs: what the nodes read that none of them makes
    and no weight holds, typed as `model` types them (else float; a Gather's indices int64); its outputs: what the
    nodes make that another node of `model`, or its output, reads (float), or all of it when none does."""
    stored = {i.name: i for i in model.graph.initializer}
    if weight is not None:
        stored[weight.name] = weight
    types = _types(model.graph)
    made = {o for node in nodes for o in node.output if o}
    read = list(dict.fromkeys(i for node in nodes for i in node.input if i))
    indices = {node.input[1] for node in nodes if node.op_type == "Gather"}
    inputs = [
        onnx.helper.make_tensor_value_info(
            name, types.get(name, onnx.TensorProto.INT64 if name in indices else onnx.TensorProto.FLOAT), None
        )
        for name in read
        if name not in made and name not in stored
    ]
    inside = {id(node) for node in nodes}
    outside = {i for node in model.graph.node if id(node) not in inside for i in node.input}
    outside |= {o.name for o in model.graph.output}
    kept = [o for o in made if o in outside] or sorted(made)
    outputs = [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in kept]
    weights = [resolved(stored[name]) for name in read if name in stored]
    graph = onnx.helper.make_graph(list(nodes), "one", inputs, outputs, weights)
    return onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)


def groups(graph: onnx.GraphProto, names: set[str]) -> list[list[onnx.NodeProto]]:
    """The nodes named in `names`, in the graph's order, in groups joined where one reads what another makes:
    a quantizer rounds such nodes together (quantize_dynamic feeds a Gather's int8 rows to the MatMul that reads
    them, where alone each would go back to float between them)."""
    chosen = [node for node in graph.node if node.name in names]
    group_of: dict[str, list] = {}
    maker = {o: node.name for node in chosen for o in node.output}
    for node in chosen:
        joined = [group_of[maker[i]] for i in node.input if i in maker]
        group = next(iter(joined), [])
        for other in joined[1:]:
            if other is not group:
                group.extend(other)
                for member in other:
                    group_of[member.name] = group
        group.append(node)
        group_of[node.name] = group
    at = {node.name: i for i, node in enumerate(chosen)}
    seen, out = set(), []
    for node in chosen:
        group = group_of[node.name]
        if id(group) not in seen:
            seen.add(id(group))
            out.append(sorted(group, key=lambda member: at[member.name]))
    return out


def _in_order(nodes: list[onnx.NodeProto], given: set[str]) -> list[onnx.NodeProto]:
    """`nodes` in their order where each reads only what `given` (the graph's inputs and weights) or a node before it
    holds, else each pass taking the nodes whose inputs are made: a group's nodes go where its first was."""
    ready, out, waiting = set(given) | {""}, [], nodes
    while waiting:
        left = []
        for node in waiting:
            if all(i in ready for i in node.input):
                out.append(node)
                ready.update(node.output)
            else:
                left.append(node)
        if len(left) == len(waiting):
            raise CompressorError(
                f"the quantized graph reads {next(i for i in left[0].input if i not in ready)!r}, which no node makes"
            )
        waiting = left
    return out


Quantizer = Callable[[onnx.ModelProto], onnx.ModelProto]  # ONNX Runtime's, on a graph of a few nodes alone


def _wide(group: list[onnx.NodeProto], inits: dict, axes: dict[str, int]) -> onnx.TensorProto | None:
    """The stored weight of a group of one node whose operator `axes` may slice, when it passes SLICE_BYTES."""
    (node, *others) = group
    if others or node.op_type not in axes or node.input[WEIGHT_INPUT[node.op_type]] not in inits:
        return None
    weight = inits[node.input[WEIGHT_INPUT[node.op_type]]]
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(weight.data_type).itemsize
    return weight if itemsize * int(np.prod(weight.dims)) > SLICE_BYTES else None


def each_node(
    model: onnx.ModelProto, chosen: dict[str, Quantizer], joined: bool = False, axes: dict[str, int] | None = None
) -> onnx.ModelProto:
    """A new graph: `model` with each node named in `chosen` replaced by what its quantizer (ONNX Runtime's) makes of
    a graph of it alone: its nodes in its place (a node made twice, the same input's quantization, once), its
    initializers added, a stored weight dropped where no other node reads it. With `joined`, the nodes that read one
    another together (`groups`: a quantizer whose int8 output the next reads); `axes`, operator → the axis along
    which a node of it alone has its wide weight given a slice at a time (`sliced`; its quantizer rounds each slice
    as it rounds the whole). One weight's copies at a time; built anew, not changed in place (a protobuf message
    keeps the bytes of what it drops: files.onnx_files)."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    uses = collections.Counter(name for node in graph.node for name in node.input)
    together = groups(graph, set(chosen)) if joined else [[n] for n in graph.node if n.name in chosen]
    firsts = {group[0].name: group for group in together}
    members = {node.name for group in firsts.values() for node in group}
    nodes, added, domains, made, touched = [], {}, {}, set(), set()
    bar = tqdm(total=len(firsts), desc="quantized a node at a time", unit="node", leave=False)
    for node in graph.node:
        if node.name in members and node.name not in firsts:
            continue  # quantized with its group's first
        if node.name not in firsts:
            nodes.append(node)
            continue
        group = firsts[node.name]
        wide = _wide(group, inits, axes or {})
        if wide is not None:
            done = sliced(model, node, wide, chosen[node.name], axes[node.op_type])
        else:
            done = chosen[node.name](alone(model, *group))
        for member in group:
            touched.update(i for i in member.input if i in inits)
            uses.subtract(i for i in member.input if i in inits)
        for new in done.graph.node:
            if new.output[0] in made:
                continue
            made.update(new.output)
            nodes.append(_own(new))
            uses.update(i for i in new.input if i in inits)
        for tensor in done.graph.initializer:
            if tensor.name in inits:
                continue
            if tensor.name in added and added[tensor.name].SerializeToString() != tensor.SerializeToString():
                raise CompressorError(f"the quantizer rounded {tensor.name!r} two ways for two nodes")
            added[tensor.name] = _own(tensor)
        domains.update({o.domain: o.version for o in done.opset_import})
        bar.update()
    bar.close()
    out = onnx.ModelProto()
    copy_fields(model, out, ("graph",))
    copy_fields(graph, out.graph, ("node", "initializer"))
    out.graph.node.extend(_in_order(nodes, {i.name for i in graph.input} | set(inits) | set(added)))
    out.graph.initializer.extend(i for i in graph.initializer if i.name not in touched or uses[i.name] > 0)
    while added:  # each let go as it is copied in: not all the rounded weights twice at the end
        out.graph.initializer.append(added.pop(next(iter(added))))
    held = {o.domain for o in out.opset_import}
    out.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in domains.items() if d not in held)
    return out


def _own(message: Message) -> Message:
    """A copy of `message` in a message of its own: a part of a protobuf message kept alive keeps the whole message's
    memory (ONNX Runtime's quantizer's graph of one node holds the fp32 weight it dropped: SmolLM2's 0.4 GB of them
    held till the last node was done)."""
    own = type(message)()
    own.CopyFrom(message)
    return own


def sliced(
    model: onnx.ModelProto,
    node: onnx.NodeProto,
    weight: onnx.TensorProto,
    quantized: Quantizer,
    axis: int,
) -> onnx.ModelProto:
    """What `quantized` makes of `model`'s `node` and its wide `weight` alone, given a slice of SLICE_BYTES along
    `axis` at a time (a MatMul's columns, a Gather's rows), the slices' tensors joined: MatMulNBits' along N (a
    column's blocks are rounded alone), another's quantized weight along `axis` (a scale per column along its
    one), a scalar (the scale of the whole weight, at whose range the quantizer rounds each slice) the same in all.
    ONNX Runtime's k-quant holds some 11× the weight it is given, its per-tensor int8 5× (Qwen2.5-0.5B's
    151,936-row head: 6 GB, 2.7 GB)."""
    array = weight_array(weight)
    count = array.shape[axis]
    step = max(1, SLICE_BYTES // (array.nbytes // count))
    cut = (np.ascontiguousarray(np.take(array, range(at, min(at + step, count)), axis)) for at in range(0, count, step))
    parts = [quantized(alone(model, node, weight=numpy_helper.from_array(part, weight.name))) for part in cut]
    del array
    first = parts[0]
    ops = [n.op_type for n in first.graph.node]
    if any([n.op_type for n in part.graph.node] != ops for part in parts[1:]):
        raise CompressorError(f"the slices of {weight.name!r} were quantized into different operators")
    join = 0 if "MatMulNBits" in ops else axis
    for made in first.graph.node:
        for attribute in made.attribute:
            if made.op_type == "MatMulNBits" and attribute.name == "N":
                attribute.i = count
    pieces = {i.name: [numpy_helper.to_array(i)] for i in first.graph.initializer if i.name != weight.name}
    for part in parts[1:]:
        for tensor in part.graph.initializer:
            if tensor.name in pieces:
                pieces[tensor.name].append(numpy_helper.to_array(tensor))
    one = onnx.ModelProto()
    copy_fields(first, one, ("graph",))
    copy_fields(first.graph, one.graph, ("initializer",))
    for name, arrays in pieces.items():
        if arrays[0].ndim:  # a weight's codes, or a scale per column (the last axis of one along `axis`)
            joined = np.concatenate(arrays, min(join, arrays[0].ndim - 1))
            one.graph.initializer.append(numpy_helper.from_array(joined, name))
        elif all(np.array_equal(a, arrays[0]) for a in arrays[1:]):
            one.graph.initializer.append(numpy_helper.from_array(arrays[0], name))
        else:
            raise CompressorError(f"the slices of {weight.name!r} were rounded at different scales ({name!r})")
    return one


def with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with the shapes and types of its tensors (value_info) as onnx's inference finds them, which the
    whole-graph quantizer leaves in its graph and ONNX Runtime's fusions read (MiniLM's int8 without them: another
    fusion, outputs 0.065 apart); inferred on a copy without the weights' values (their dims kept), not 2 GB."""
    skeleton = onnx.ModelProto()
    copy_fields(model, skeleton, ("graph",))
    copy_fields(model.graph, skeleton.graph, ("initializer", "value_info"))
    for tensor in model.graph.initializer:
        entry = skeleton.graph.initializer.add()
        if len(tensor.raw_data) < SHAPE_BYTES and not is_lazy(tensor):
            entry.CopyFrom(tensor)
        else:
            copy_fields(tensor, entry, ("raw_data", "external_data"))
            entry.data_location = onnx.TensorProto.EXTERNAL  # its values elsewhere: inference reads its dims
            entry.external_data.add(key="location", value="none")
    inferred = onnx.shape_inference.infer_shapes(skeleton).graph.value_info
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred)
    return model
