"""int8: ONNX Runtime's dynamic int8 (`quantize_dynamic`), the one line every user knows: each weight
w = s·q with int8 q per output channel (MatMul weights, factor matrices, TT cores and tables behind a Gather
alike), |q| ≤ TARGETS[target] for the CPU it is written for (target_cpu), each activation rounded to uint8 at
run time with one scale a tensor."""

from dataclasses import dataclass
from pathlib import Path

import onnx

from converters.options import Option, option_field
from converters.quantization.registry import QuantizeResult, SchemeConfig, Source, Written, register
from converters.quantization.rounding.int4 import quiet_quantizer
from converters.quantization.rounding.target_cpu import NATIVE, TARGETS, measured_target, reduces_range, targets_of
from files.onnx_files import save_onnx

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
        measured)."""
        return source.fp32(), None

    def write(self, source: Source, out: Path) -> Written:
        model, outlying = self.smoothed(source)
        plain = self.plain(model, source)
        del model  # ONNX Runtime's quantizer reads its own from the file: an LM's graph is most of the memory
        self.write_int8(plain, source, out)
        return Written(outliers=outlying)

    def plain(self, model: onnx.ModelProto, source: Source) -> Path:
        """`model` saved in the scratch folder (without the fp32 parity of the metadata), for the quantizer."""
        path = source.work / "plain.onnx"
        save_onnx(model, path)
        return path

    def write_int8(self, plain: Path, source: Source, out: Path) -> None:
        """The graph at `plain` through ONNX Runtime's quantize_dynamic into `out`, at the target's int8 range."""
        from onnxruntime.quantization import QuantType, quantize_dynamic

        with quiet_quantizer():
            reduce = reduces_range(self.target())
            per_channel = source.kind.int8_per_channel
            quantize_dynamic(plain, out, per_channel=per_channel, weight_type=QuantType.QInt8, reduce_range=reduce)

    def report(self, result: QuantizeResult) -> dict:
        return {"target_cpu": self.target()}
