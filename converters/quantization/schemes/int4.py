"""int4: 4-bit weights in blocks, rounded to nearest (converters.quantization.rounding.int4): each block of
`block_size` weights w ≈ scale · q, q in [−8, 7], MatMul weights as MatMulNBits and tables behind a Gather as
GatherBlockQuantized; a tied table's rows read from its head's codes (tied_codes). `FourBitConfig` holds what
every 4-bit scheme shares: the blocks, MatMulNBits' compute and how the block scales are stored."""

from dataclasses import dataclass
from pathlib import Path

import onnx

from compressor.errors import CompressorError
from converters.options import Option, option_field
from converters.quantization.registry import QuantizeResult, SchemeConfig, Source, Written, register
from converters.quantization.rounding.int4 import (
    ACCURACY_LEVELS,
    INT4_ACCURACY,
    INT4_BLOCK,
    check_int4_options,
    quantize_4bit,
)
from converters.quantization.storage.byte_scales import SCALE_BITS, byte_scales
from converters.quantization.storage.half_scales import half_scales
from converters.quantization.storage.tied_codes import share_tied_codes, tied_smoothing
from files.onnx_files import save_onnx

__all__ = ["TABLE_BLOCK", "FourBitConfig", "Int4Config"]

BLOCK_SIZE = Option("--block-size", "weights per block sharing one scale, a power of two ≥ 16", int)
ACCURACY_LEVEL = Option(
    "--accuracy-level",
    "MatMulNBits' compute, 0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8 activations",
    int,
    choices=ACCURACY_LEVELS,
    default=f"{INT4_ACCURACY}, the fastest here",
)
SCALE_BITS_OPTION = Option(
    "--scale-bits",
    "the linear layers' block scales in fp16 (16) or in one byte on each row's log grid (8), computed back when the "
    "session starts",
    int,
    choices=SCALE_BITS,
    metavar="BITS",
    neutral=16,
)
TABLE_BLOCK = Option(
    "--table-block",
    "the tables' weights per block sharing one scale, a power of two ≥ 16; larger blocks spend fewer bytes on the "
    "table's scales, which the corrections can take instead",
    int,
    metavar="N",
    default="--block-size",
)


@dataclass(frozen=True)
class FourBitConfig(SchemeConfig):
    """A 4-bit scheme's blocks of `block_size` weights, MatMulNBits' `accuracy_level` and `scale_bits`: the linear
    layers' block scales in fp16 (16) or one byte (8: byte_scales), the rest in fp16 (half_scales)."""

    width = 4
    gate = 0.5  # int4 measured 0.27 (plain) and 0.20 (aware) on random ids for all-MiniLM-L6-v2, 0.29 for its emb4
    block_size: int = option_field(INT4_BLOCK, BLOCK_SIZE)
    accuracy_level: int = option_field(INT4_ACCURACY, ACCURACY_LEVEL)
    scale_bits: int = option_field(16, SCALE_BITS_OPTION)

    def __post_init__(self):
        check_int4_options(self.block_size, self.accuracy_level)
        if self.scale_bits not in SCALE_BITS:
            raise CompressorError(f"--scale-bits is one of {', '.join(map(str, SCALE_BITS))}, got {self.scale_bits}")

    @property
    def tables_block(self) -> int:
        """The weights per block of its tables."""
        return self.block_size

    def stored(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A 4-bit graph's scales as written."""
        return half_scales(byte_scales(model) if self.scale_bits == 8 else model)

    def report(self, result: QuantizeResult) -> dict:
        return {
            "block": self.block_size,
            "accuracy_level": self.accuracy_level,
            "eight_bit_layers": list(result.eight_bit),
            "table_block": self.tables_block,
            "scale_bits": self.scale_bits,
            "linear_bits": result.linear_bits,
        }


@register
@dataclass(frozen=True)
class Int4Config(FourBitConfig):
    """Plain 4-bit blocks; the tables in blocks of `table_block` (None: `block_size`)."""

    scheme = "int4"
    summary = "4-bit blocks, rounded to nearest"
    table_block: int | None = option_field(None, TABLE_BLOCK)

    def __post_init__(self):
        super().__post_init__()
        if self.table_block is not None:
            check_int4_options(self.table_block, self.accuracy_level)

    @property
    def tables_block(self) -> int:
        return self.block_size if self.table_block is None else self.table_block

    def write(self, source: Source, out: Path) -> Written:
        model = source.fp32(lazy=True)  # each MatMul's weight read as it is rounded, the tables' for their quantizer
        tied = tied_smoothing(model.graph)
        quantized = quantize_4bit(model, self.block_size, self.accuracy_level, table_block=self.tables_block)
        save_onnx(self.stored(share_tied_codes(quantized, tied)), out)
        return Written()
