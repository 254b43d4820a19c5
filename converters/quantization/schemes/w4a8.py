"""w4a8 (encoders): int4-trained's file multiplied in int8 (corrections/int8_products.py): each layer whose input
one int8 scale a tensor holds becomes DynamicQuantizeMatMul on W8 = round((Q + L R) / s), folded from the stored
codes and factors when the session starts; its student rounds those inputs as the graph will while it trains."""

from dataclasses import dataclass

import onnx

from compressor.errors import CompressorError
from converters.options import option_field
from converters.quantization.corrections.int8_products import int8_layers, int8_products
from converters.quantization.registry import QuantizeResult, register
from converters.quantization.rounding.target_cpu import NATIVE, int8_level, measured_target, targets_of
from converters.quantization.schemes.int4_trained import CORRECTION_LR_OPTION, Int4TrainedConfig
from converters.quantization.schemes.int8 import TARGET_CPU
from eval.kinds import GraphKind

__all__ = ["W4A8Config"]


@register
@dataclass(frozen=True)
class W4A8Config(Int4TrainedConfig):
    """int4-trained multiplied in int8 on the CPU `target_cpu`; its 3-bit table and 8-bit inputs start further
    off, so it trains at a larger rate. Smoothed at int4's α too: at int8-aware's 0.8 more layers hold their inputs
    in one int8 scale, but the 4-bit rounding loses more (recall@10 0.9277 / 0.9180 against 0.9325 / 0.9210:
    BENCHMARKS.md, "4-bit codes, int8 products")."""

    scheme = "w4a8"
    summary = "(encoders) int4-trained's file multiplied in int8"
    correction_lr: float = option_field(3e-3, CORRECTION_LR_OPTION)
    target_cpu: str = option_field(NATIVE, TARGET_CPU)

    def __post_init__(self):
        super().__post_init__()
        targets_of(self.target_cpu)

    def target(self) -> str:
        return measured_target(self.target_cpu)

    def targets(self) -> tuple[str, ...]:
        return targets_of(self.target_cpu)

    def check(self, kind: GraphKind) -> None:
        """Int8 products go with a graph kind whose products are int8 (an encoder's)."""
        if kind.factor_form != "int8":
            raise CompressorError(
                f"{self.scheme} rounds the activations to 8 bits with one scale a tensor, which an LM's outliers do "
                "not survive: use int4-trained for an LM"
            )
        super().check(kind)

    def int8_inputs(self, model: onnx.ModelProto, calibration: list[dict]) -> frozenset[str]:
        """The layers whose inputs one int8 scale a tensor holds (int8_products.int8_layers)."""
        return int8_layers(model, calibration)

    def products(self, model: onnx.ModelProto, int8: frozenset[str]) -> onnx.ModelProto:
        """The layers `int8` multiplied in int8, at the target's level."""
        return int8_products(model, int8, int8_level(self.target()))

    def report(self, result: QuantizeResult) -> dict:
        return {**super().report(result), "int8_layers": list(result.int8_layers), "target_cpu": self.target()}
