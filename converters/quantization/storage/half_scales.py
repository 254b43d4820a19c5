"""The 4-bit (and 8-bit) weights' block scales stored in half precision. ONNX Runtime's MatMulNBits
and GatherBlockQuantized take their scales in the activations' type (float32 here), one per block of
16–64 weights: in blocks of 16 an fp32 scale costs 2 bits a weight, a third of what the weight costs.
Each such scales initializer s is stored as fp16 and read back through a `Cast` to float32, which ONNX
Runtime folds into a constant when the session starts (the kernels pre-pack it as before, at the same
speed). The graph then multiplies by fp16(s): a relative change of at most 2⁻¹¹ per block, against the
4-bit rounding's 2⁻⁴ (BENCHMARKS.md, "Scales in half precision"). A tensor with a value fp16 cannot hold
within that (above 65504, or below 2⁻¹⁴ where fp16 loses precision) stays fp32."""

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["SCALE_BYTES", "SCALED_OPS", "HALF_SUFFIX", "half_scales"]

SCALE_BYTES = 2  # what one block's scale costs in a written graph
SCALED_OPS = ("MatMulNBits", "GatherBlockQuantized")  # their input 2 is the blocks' scales
HALF_SUFFIX = "_fp16"
_TINY, _HUGE = 2.0**-14, 65504.0  # fp16's smallest normal and largest finite values


def _holds(values: np.ndarray) -> bool:
    """Whether fp16 holds every value to its own precision: finite, zero or a normal fp16 magnitude."""
    magnitude = np.abs(values)
    return bool(
        np.all(np.isfinite(values)) and np.all((magnitude == 0) | ((magnitude >= _TINY) & (magnitude <= _HUGE)))
    )


def half_scales(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (changed in place) with each float32 scales initializer of its SCALED_OPS nodes stored as
    fp16 under NAME_fp16 and cast back to float32 as NAME by a node at the head of the graph."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    names = {n.input[2] for n in graph.node if n.op_type in SCALED_OPS and len(n.input) > 2}
    casts = []
    for name in sorted(names):
        init = inits.get(name)
        if init is None or init.data_type != onnx.TensorProto.FLOAT:
            continue
        values = numpy_helper.to_array(init)
        if not _holds(values):
            continue
        init.CopyFrom(numpy_helper.from_array(values.astype(np.float16), name + HALF_SUFFIX))
        casts.append(
            helper.make_node("Cast", [name + HALF_SUFFIX], [name], name=f"{name}_cast", to=onnx.TensorProto.FLOAT)
        )
    nodes = [*casts, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    return model
