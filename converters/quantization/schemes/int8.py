"""int8: ONNX Runtime's dynamic int8 (`quantize_dynamic`), the one line every user knows: each weight
w = s·q with int8 q per output channel (MatMul weights, factor matrices, TT cores and tables behind a Gather
alike), |q| ≤ TARGETS[target] for the CPU it is written for (target_cpu), each activation rounded to uint8 at
run time with one scale a tensor. ONNX Runtime's quantizer is given a node at a time (with the nodes that read its
int8 output: one_node.each_node): given the whole graph it held ~4 copies of it (Qwen2.5-0.5B's shape: 7.8 GB above
the process for its 2 GB of weights)."""

import functools
from dataclasses import dataclass
from pathlib import Path

import onnx

from converters.options import Option, option_field
from converters.quantization.registry import QuantizeResult, SchemeConfig, Source, Written, register
from converters.quantization.rounding.int4 import name_nodes, quiet_quantizer
from converters.quantization.rounding.one_node import each_node, with_shapes
from converters.quantization.rounding.target_cpu import NATIVE, TARGETS, measured_target, reduces_range, targets_of
from files.onnx_files import load_onnx, save_onnx, weight_range

__all__ = ["TARGET_CPU", "Int8Config"]

TARGET_CPU = Option(
    "--target-cpu",
    f"the CPU the int8 products are written for: {NATIVE} (this machine's), {', '.join(TARGETS)}, or several joined "
    "by commas (one graph each, model_qint8_TARGET.onnx); avx2 and avx512 (no VNNI) sum pairs of products in int16, "
    "so their int8 weights keep to 7 bits",
    metavar="PATH",
)


@register
@dataclass(frozen=True)
class Int8Config(SchemeConfig):
    """Dynamic int8 for the CPU `target_cpu` (target_cpu.TARGETS, or NATIVE: this machine's)."""

    scheme = "int8"
    summary = "ONNX Runtime's dynamic int8"
    width = 8
    # Relative output error against the fp32 graph, measured on random ids (before the gate read text): 0.15 for
    # all-MiniLM-L6-v2 and 0.20 for its fine-tuned TT rank-64 variant, 0.566 for a 110M MPNet whose int8 keeps
    # 0.925 recall@10 (random ids make activations no text makes); on text 0.164, int8-aware 0.121 for
    # all-MiniLM-L6-v2 (BENCHMARKS.md, "The int8 gate on text"). A graph quantized wrongly is near 1.
    gate = 0.35
    target_cpu: str = option_field(NATIVE, TARGET_CPU)

    def __post_init__(self):
        targets_of(self.target_cpu)

    def target(self) -> str:
        return measured_target(self.target_cpu)

    def targets(self) -> tuple[str, ...]:
        return targets_of(self.target_cpu)

    def smoothed(self, source: Source) -> tuple[onnx.ModelProto, dict | None]:
        """The graph the int8 weights are rounded from, and the layers whose inputs hold outliers (None: not
        measured); int8's own leaves its weights in their file, each read as its node is quantized."""
        return source.fp32(lazy=True), None

    def write(self, source: Source, out: Path) -> Written:
        model, outlying = self.smoothed(source)
        self.write_int8(model, source, out)
        return Written(outliers=outlying)

    def write_int8(self, model: onnx.ModelProto, source: Source, out: Path) -> None:
        """`model` (its nodes named here; its weights may be left in their file: load_lazy) through ONNX Runtime's
        quantize_dynamic into `out`, at the target's int8 range: each node of an operator it quantizes that reads a
        stored float weight (with those that read its int8 output) alone, in the scratch folder, a wide weight a
        slice at a time at the whole weight's range (per tensor: its min and max given to the quantizer); the
        tensors' shapes inferred, as quantize_dynamic leaves them."""
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from onnxruntime.quantization.registry import IntegerOpsRegistry

        reduce, per_channel = reduces_range(self.target()), source.kind.int8_per_channel
        src, dst = source.work / "one.onnx", source.work / "one_int8.onnx"
        stored = {i.name: i for i in model.graph.initializer}

        @functools.cache
        def whole_range(name: str) -> list[dict[str, float]]:
            low, high = weight_range(stored[name])
            return [{"rmin": low, "rmax": high}]

        def quantized(one: onnx.ModelProto) -> onnx.ModelProto:
            cut = [i.name for i in one.graph.initializer if i.name in stored and i.dims != stored[i.name].dims]
            ranges = {} if per_channel else {name: whole_range(name) for name in cut}  # a slice of a wide weight
            save_onnx(one, src)
            with quiet_quantizer():
                quantize_dynamic(
                    src,
                    dst,
                    per_channel=per_channel,
                    weight_type=QuantType.QInt8,
                    reduce_range=reduce,
                    extra_options={"TensorQuantOverrides": ranges} if ranges else None,
                )
            return load_onnx(dst)

        name_nodes(model.graph)
        floats = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
        ops = set(IntegerOpsRegistry) - {"Transpose"}  # a Transpose is rounded only after a rounded node
        chosen = {n.name: quantized for n in model.graph.node if n.op_type in ops and floats.intersection(n.input)}
        # a MatMul's columns round alone per channel; per tensor, any slice at the whole weight's range
        axes = {"MatMul": 1} if per_channel else {"MatMul": 1, "Gather": 0}
        save_onnx(with_shapes(each_node(model, chosen, joined=True, axes=axes)), out)

    def report(self, result: QuantizeResult) -> dict:
        return {"target_cpu": self.target()}
