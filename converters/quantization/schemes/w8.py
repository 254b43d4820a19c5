"""w8: 8-bit weights in blocks (MatMulNBits with 8 bits, ONNX Runtime's weight-only quantizer): each block of
`block_size` weights along a column w ≈ scale · q, q in [−128, 127], one fp32 scale a block, rounded to nearest;
the activations are never rounded to one range a tensor (int8's per-tensor uint8 loses an LM's outlier channels):
MatMulNBits' compute at `accuracy_level` 4 rounds each block of the input to int8 with its own scale, at 1 keeps
it fp32. A tied table's rows are read from its head's codes (tied_codes); other tables stay fp32."""

from dataclasses import dataclass
from pathlib import Path

from converters.options import option_field
from converters.quantization.registry import QuantizeResult, SchemeConfig, Source, Written, register
from converters.quantization.rounding.int4 import (
    INT4_ACCURACY,
    check_int4_options,
    name_nodes,
    quantize_matmuls,
)
from converters.quantization.schemes.int4 import ACCURACY_LEVEL, BLOCK_SIZE
from converters.quantization.storage.half_scales import half_scales
from converters.quantization.storage.tied_codes import share_tied_codes, tied_smoothing
from files.onnx_files import save_onnx

__all__ = ["W8_BLOCK", "W8Config"]

# Blocks of 16 inputs share an activation scale at accuracy level 4: top-1 agreement with the fp32 graph 0.967 / 0.954
# on SmolLM2-135M (pydoc / news, 40 passages each), against 0.957 / 0.949 in blocks of 32, whose steps were ~10 %
# faster (8.4 against 9.6 ms a token at context 128, avx512_vnni); at level 1 (fp32 products) 0.979 / 0.967, but
# ONNX Runtime 1.32 has no fast 8-bit kernel for it: 704 ms a token on Gemma-3-270M against 11.3
W8_BLOCK = 16


@register
@dataclass(frozen=True)
class W8Config(SchemeConfig):
    """8-bit weights in blocks of `block_size`, MatMulNBits' compute at `accuracy_level`."""

    scheme = "w8"
    summary = "8-bit weights in blocks (MatMulNBits), activations rounded a block at a time or not at all"
    width = 8
    gate = 0.35  # int8's
    block_size: int = option_field(W8_BLOCK, BLOCK_SIZE)
    accuracy_level: int = option_field(INT4_ACCURACY, ACCURACY_LEVEL)

    def __post_init__(self):
        check_int4_options(self.block_size, self.accuracy_level)

    def write(self, source: Source, out: Path) -> Written:
        model = source.fp32(lazy=True)  # each MatMul's weight read as it is rounded
        tied = tied_smoothing(model.graph)
        name_nodes(model.graph)
        quantized = quantize_matmuls(model, self.block_size, self.accuracy_level, aware=False, bits=8)
        save_onnx(half_scales(share_tied_codes(quantized, tied)), out)
        return Written()

    def report(self, result: QuantizeResult) -> dict:
        return {"block": self.block_size, "accuracy_level": self.accuracy_level}
