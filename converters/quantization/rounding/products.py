"""Products by a stored weight written as MatMul before quantizing: ONNX Runtime's quantizers (MatMulNBits' above
all) take a weight only where a MatMul multiplies by it, and pass a Gemm or a FusedMatMul by."""

import numpy as np
import onnx

from files.onnx_files import WeightFile, weight_array

__all__ = ["products_as_matmul"]


def products_as_matmul(proto: onnx.ModelProto, weights: WeightFile | None = None) -> onnx.ModelProto:
    """In place: each product by a stored weight W that is not a MatMul becomes one, which the quantizers take as
    they take any MatMul weight: x Wᵀ — FusedMatMul(x, W, transB=1) (a tied head: compressor.tied_logits) or
    Gemm(x, W, transB=1) — MatMul(x, Wᵀ) on a transposed copy of W (W itself stays for the Gathers that read
    it), written into `weights` where given (the graph then holds none of its bytes: a 262,144-row head's copy is
    0.67 GB); Gemm(x, W) + C (GPT-2's Conv1D) MatMul(x, W) then Add(C). Only alpha = beta = 1, x not transposed."""
    graph = proto.graph
    stored = {init.name: init for init in graph.initializer}
    transposed: dict[str, str] = {}
    nodes = []
    for node in graph.node:
        nodes.append(node)
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        plain = attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0
        plain = plain and not any(attrs.get(a, 0) for a in ("transA", "transBatchA", "transBatchB"))
        bias = node.input[2] if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2] else None
        if node.op_type not in ("Gemm", "FusedMatMul") or not plain or node.input[1] not in stored:
            continue
        if node.op_type == "FusedMatMul" and (len(node.input) != 2 or attrs.get("transB", 0) != 1):
            continue
        name = node.input[1]
        if attrs.get("transB", 0) == 1:
            if name not in transposed:
                transposed[name] = f"{name}_transposed"
                data = np.swapaxes(weight_array(stored[name]), -1, -2)  # the last two axes
                if weights is None:
                    graph.initializer.append(onnx.numpy_helper.from_array(data.copy(), transposed[name]))
                else:
                    graph.initializer.append(weights.add_array(transposed[name], data))
            node.input[1] = transposed[name]
        node.op_type, node.domain = "MatMul", ""
        del node.attribute[:]
        if bias is not None:
            out = node.output[0]
            del node.input[2:]
            node.output[0] = f"{out}_product"
            named = f"{node.name}_bias" if node.name else ""
            nodes.append(onnx.helper.make_node("Add", [node.output[0], bias], [out], name=named))
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for node in graph.node for i in node.input}
    unused = [init for init in graph.initializer if init.name in transposed and init.name not in used]
    for init in unused:
        graph.initializer.remove(init)
    return proto
