"""mixed (with --budget): each module quantized at the width a byte budget chose with its size
(converters.quantization.corrections.mixed): int4 layers as MatMulNBits (k-quant) and GatherBlockQuantized, int8 layers
as dynamic int8, fp32 left; the widths are the compressed model's plan's."""

from dataclasses import dataclass
from pathlib import Path

from converters.quantization.corrections.mixed import quantize_mixed
from converters.quantization.registry import Source, Written, register
from converters.quantization.schemes.int4 import FourBitConfig
from files.onnx_files import save_onnx

__all__ = ["MixedConfig"]


@register
@dataclass(frozen=True)
class MixedConfig(FourBitConfig):
    """The plan's widths, its 4-bit layers in blocks of `block_size`."""

    scheme = "mixed"
    summary = "(with --budget) each layer's width chosen"
    planned = True

    def write(self, source: Source, out: Path) -> Written:
        quantized = quantize_mixed(source.fp32(), dict(source.widths), self.block_size, self.accuracy_level)
        save_onnx(self.stored(quantized), out)
        return Written()
