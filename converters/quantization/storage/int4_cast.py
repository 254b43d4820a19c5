"""Weights stored in 4 bits that ONNX Runtime multiplies in int8: the codes as an initializer of ONNX type INT4
(two's complement, two a byte, opset 21) behind one `Cast` to INT8 under the weight's own name. Every input of the
Cast is an initializer, so ONNX Runtime folds it when the session starts (exactly: every code −8…7 comes back) and
the graph runs its int8 product (MatMulInteger, fused into DynamicQuantizeMatMul) on the int8 weight it gave; the
file holds half of int8's bytes and the process what int8's holds, no float intermediate between (measured on
24 layers of 1536 × 1536: 28.5 MB against 56.8 MB, peak RSS 179 MiB against 176)."""

import numpy as np
import onnx
from onnx import TensorProto, helper

from converters.nbits_storage import TABLE_OPSET, pack

__all__ = ["INT4_SUFFIX", "store_int4", "int4_weights", "int4_codes"]

INT4_SUFFIX = "_int4"  # the INT4 initializer's name: the int8 weight's, with this after it


def store_int4(model: onnx.ModelProto, name: str, codes: np.ndarray) -> None:
    """Replace `model`'s int8 initializer `name` by `codes` (its shape, integers in [−8, 7]) in INT4 behind a Cast
    that gives `name` back; the default domain raised to opset 21 where lower (changed in place)."""
    graph = model.graph
    held = next(i for i in graph.initializer if i.name == name)
    if tuple(held.dims) != codes.shape or codes.min() < -8 or codes.max() > 7:
        raise ValueError(
            f"{name}: codes of shape {codes.shape} in [{codes.min()}, {codes.max()}] for {list(held.dims)}"
        )
    flat = (codes.astype(np.int64).reshape(1, -1) & 0xF).astype(np.uint8)
    flat = np.pad(flat, ((0, 0), (0, flat.shape[1] % 2)))  # an odd count: its last byte's high half unused
    packed = pack(flat, 4).tobytes()
    graph.initializer.remove(held)
    graph.initializer.append(helper.make_tensor(name + INT4_SUFFIX, TensorProto.INT4, codes.shape, packed, raw=True))
    graph.node.insert(
        0, helper.make_node("Cast", [name + INT4_SUFFIX], [name], name=name + "/cast", to=TensorProto.INT8)
    )
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version < TABLE_OPSET:
            opset.version = TABLE_OPSET


def int4_weights(graph: onnx.GraphProto) -> dict[str, str]:
    """Weight name → its INT4 initializer's name, of every weight stored by `store_int4`."""
    held = {i.name for i in graph.initializer if i.data_type == TensorProto.INT4}
    return {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Cast" and n.input[0] in held}


def int4_codes(graph: onnx.GraphProto, name: str) -> np.ndarray:
    """The codes of the INT4 initializer `name`, as int8."""
    return onnx.numpy_helper.to_array(next(i for i in graph.initializer if i.name == name)).astype(np.int8)
