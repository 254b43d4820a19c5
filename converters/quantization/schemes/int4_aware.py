"""int4-aware: 4-bit blocks fitted to the data (converters.quantization.rounding.int4): SmoothQuant at α = 0.5 first
(exact in fp32), so that the rounding spends its levels where the activations are large (AWQ's idea), the
MatMul weights by k-quant and the tables by asymmetric RTN, w ≈ scale · (q − z); then the layers whose 4 bits
cost the output most per byte in 8 (int4.eight_bit_layers), and the word table's rows of the `table_head` most
frequent tokens in 8 bits (table_head, tied_head), its tail in `table_bits`."""

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import onnx

from compressor.errors import CompressorError
from converters.options import Option, option_field
from converters.quantization.corrections.sensitivity import four_bit_losses
from converters.quantization.registry import QuantizeResult, Source, Written, register
from converters.quantization.rounding.int4 import INT4_AWARE_ALPHA, eight_bit_layers, quantize_4bit
from converters.quantization.rounding.smoothing import smoothed
from converters.quantization.rounding.table_head import TABLE_HEAD, frequent_ids
from converters.quantization.rounding.tied_head import split_tied_head
from converters.quantization.schemes.int4 import Int4Config
from converters.quantization.storage.codebook_table import CODEBOOK_BITS
from converters.quantization.storage.tied_codes import share_tied_codes, tied_smoothing
from eval.kinds import GraphKind
from files.onnx_files import save_onnx

__all__ = ["TABLE_BITS", "Int4AwareConfig"]

# The word table's (its tail's, with a head) widths: ONNX Runtime's 4 bits, 3 (three_bit_table), codebooks
TABLE_BITS = (4, 3, *CODEBOOK_BITS)
TABLE_HEAD_OPTION = Option(
    "--table-head",
    "the word table's rows of the calibration text's ROWS most frequent tokens in 8 bits, the rest in 4; 0: none",
    int,
    metavar="ROWS",
    neutral=TABLE_HEAD,
)
TABLE_BITS_OPTION = Option(
    "--table-bits",
    "an encoder's word table in BITS a weight (3: two bit planes; 2, 1.33, 1: a one-byte code for 4, 6, 8 weights "
    "in 256-entry codebooks); with --table-head the head then in 4 bits, the rest in BITS",
    float,
    choices=TABLE_BITS,
    metavar="BITS",
    neutral=4,
)


@register
@dataclass(frozen=True)
class Int4AwareConfig(Int4Config):
    """int4-aware after smoothing at `alpha`, its word table's `table_head` most frequent rows in 8 bits and the
    rest in `table_bits`."""

    scheme = "int4-aware"
    summary = "4-bit blocks after SmoothQuant, k-quant, the costliest layers in 8 bits"
    calibrated = True
    alpha = INT4_AWARE_ALPHA
    table_head: int = option_field(TABLE_HEAD, TABLE_HEAD_OPTION)
    table_bits: float = option_field(4, TABLE_BITS_OPTION)

    def __post_init__(self):
        super().__post_init__()
        if self.table_head < 0:
            raise CompressorError(f"--table-head is a number of table rows, 0 or more, got {self.table_head}")
        if self.table_bits not in TABLE_BITS:
            raise CompressorError(f"--table-bits is one of {', '.join(map(str, TABLE_BITS))}, got {self.table_bits:g}")

    @property
    def head_rows(self) -> int:
        return self.table_head

    def check(self, kind: GraphKind) -> None:
        """A word table below 4 bits is an encoder's (a `kind` whose products are int8): an LM's tied head shares
        the table's 4-bit codes (tied_codes)."""
        if self.table_bits != 4 and kind.factor_form != "int8":
            raise CompressorError(
                f"--table-bits {self.table_bits:g} is for an encoder's word table; an LM's tied head reads its 4-bit "
                "codes"
            )

    def channels(self, model: onnx.ModelProto, absmax: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The activations smoothed, of their maxima `absmax`: all of them."""
        return absmax

    def smoothed(self, source: Source) -> tuple[onnx.ModelProto, dict]:
        """The graph smoothed at `alpha` (its activations `channels`), and the layers whose inputs hold outliers."""
        return smoothed(partial(source.fp32, lazy=True), source.calibration, self.alpha, self.channels, source.work)

    def head(self, source: Source, model: onnx.ModelProto) -> tuple[np.ndarray | None, tuple[str, ...]]:
        """(the word table's head ids for its lookup, the nodes of a tied table's 8-bit halves): the `table_head`
        most frequent tokens, by `source.frequencies` when given, else by the batches' counts; a tied table's head
        (split in `model`, in place: tied_head) is in both its reads, not the lookup's alone."""
        head = frequent_ids(source.calibration, source.vocab, self.table_head, source.frequencies)
        tied_head = split_tied_head(model, head) if head is not None and len(head) else ()
        return (None if tied_head else head), tied_head

    def write(self, source: Source, out: Path) -> Written:
        model, outlying = self.smoothed(source)
        head, tied_head = self.head(source, model)
        losses = four_bit_losses(model, source.calibration, source.kind, self.block_size, self.accuracy_level)
        eight_bit = tuple(eight_bit_layers(model, losses))
        tied = tied_smoothing(model.graph)
        block, level, table_block = self.block_size, self.accuracy_level, self.tables_block
        quantized = quantize_4bit(
            model, block, level, True, tied_head + eight_bit, head, table_block, table_bits=self.table_bits
        )
        save_onnx(self.stored(share_tied_codes(quantized, tied)), out)
        return Written(eight_bit=eight_bit, outliers=outlying)

    def report(self, result: QuantizeResult) -> dict:
        return {**super().report(result), "table_head": self.table_head, "table_bits": result.table_bits}

    def notes(self, result: QuantizeResult) -> list[str]:
        note = result.table_note(self.table_bits)
        return [note] if note else []
