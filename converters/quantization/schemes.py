"""The quantization schemes by name, the groups of them the pipeline asks about (which read calibration
batches, which correct the rounding error, which train it, which multiply in int8, which keep a table head)
and the checks of the options that go with them (--table-head, --table-bits, --linear-bits, --scale-bits, int8
products), made before any expensive work; `weight_width` and `table_block_of` name a scheme's widths and blocks."""

from compressor.errors import CompressorError
from converters.quantization.byte_scales import SCALE_BITS
from converters.quantization.codebook_table import CODEBOOK_BITS
from converters.quantization.three_bit_linear import LINEAR_BITS

__all__ = [
    "SCHEMES",
    "TABLE_BITS",
    "PLANNED",
    "CORRECTED",
    "TRAINED",
    "INT8_PRODUCTS",
    "CALIBRATED",
    "HEAD_SCHEMES",
    "CORRECTED_TABLE_BLOCK",
    "check_int8_products",
    "check_table_head",
    "check_table_bits",
    "check_linear_bits",
    "check_scale_bits",
    "table_block_of",
    "weight_width",
]

SCHEMES = ("int8", "int8-aware", "int4", "int4-aware", "int4-corrected", "int4-trained", "w4a8", "mixed")
# The word table's (its tail's, with a head) widths: ONNX Runtime's 4 bits, 3 (three_bit_table), codebooks
TABLE_BITS = (4, 3, *CODEBOOK_BITS)
PLANNED = ("mixed",)  # the schemes whose widths a compressed model's plan chose (converters.quantization.mixed)
CORRECTED = ("int4-corrected", "int4-trained", "w4a8")  # low rank on the rounding error (quantization.correction)
TRAINED = ("int4-trained", "w4a8")  # the schemes whose corrections a fine-tune trains (quantization.training)
INT8_PRODUCTS = ("w4a8",)  # 4-bit codes multiplied in int8 (converters.quantization.int8_products)
CALIBRATED = ("int8-aware", "int4-aware", *CORRECTED)  # the schemes that need calibration batches
HEAD_SCHEMES = ("int4-aware", *CORRECTED)  # the schemes that may keep the word table's frequent rows in 8 bits
# The corrected schemes' tables in blocks of at least this many weights unless --table-block says: on
# all-MiniLM-L6-v2 blocks of 64 take int4-trained from 0.176× to 0.167× the file at the same recall@10
# (0.923 / 0.909 against 0.923 / 0.908), the bytes the scales saved left to the corrections; without
# corrections (int4-aware) they are a trade, 0.160× at 0.885 / 0.892 against 0.170× at 0.890 / 0.895
# (BENCHMARKS.md, "The tables' own block").
CORRECTED_TABLE_BLOCK = 64


def check_int8_products(schemes, kind) -> None:
    """The int8-product schemes (INT8_PRODUCTS) go with a graph kind whose products are int8 (an encoder's)."""
    asked = [scheme for scheme in schemes if scheme in INT8_PRODUCTS]
    if asked and kind.factor_form != "int8":
        raise CompressorError(
            f"{asked[0]} rounds the activations to 8 bits with one scale a tensor, which an LM's outliers do not "
            "survive: use int4-trained for an LM"
        )


def check_table_head(rows: int, schemes) -> None:
    """--table-head: a number of rows, 0 or more, asked with a scheme that takes it."""
    if rows < 0:
        raise CompressorError(f"--table-head is a number of table rows, 0 or more, got {rows}")
    if rows and not set(schemes or ()) & set(HEAD_SCHEMES):
        raise CompressorError(f"--table-head goes with --quantize {' or '.join(HEAD_SCHEMES)}")


def check_table_bits(bits: float, schemes, kind=None) -> None:
    """--table-bits: one of TABLE_BITS, below 4 asked with a scheme that takes it, for an encoder's table (a
    `kind` whose products are int8: an LM's tied head shares the table's 4-bit codes, tied_codes)."""
    if bits not in TABLE_BITS:
        raise CompressorError(f"--table-bits is one of {', '.join(map(str, TABLE_BITS))}, got {bits:g}")
    if bits != 4 and kind is not None and kind.factor_form != "int8":
        raise CompressorError(
            f"--table-bits {bits:g} is for an encoder's word table; an LM's tied head reads its 4-bit codes"
        )
    if bits != 4 and not set(schemes or ()) & set(HEAD_SCHEMES):
        raise CompressorError(f"--table-bits goes with --quantize {' or '.join(HEAD_SCHEMES)}")


def check_linear_bits(bits: int, schemes, kind=None) -> None:
    """--linear-bits: one of LINEAR_BITS; 3 asked with a corrected scheme (its correction takes back the coarser
    rounding's error) for an encoder (a `kind` whose products are int8: an LM's grid weights and tied head keep 4)."""
    if bits not in LINEAR_BITS:
        raise CompressorError(f"--linear-bits is one of {', '.join(map(str, LINEAR_BITS))}, got {bits}")
    if bits != 4 and kind is not None and kind.factor_form != "int8":
        raise CompressorError("--linear-bits 3 is for an encoder's linear layers; an LM's keep 4 bits")
    if bits != 4 and not set(schemes or ()) & set(CORRECTED):
        raise CompressorError(f"--linear-bits 3 goes with --quantize {' or '.join(CORRECTED)}")


def check_scale_bits(bits: int, schemes) -> None:
    """--scale-bits: one of SCALE_BITS, 8 asked with a 4-bit scheme."""
    if bits not in SCALE_BITS:
        raise CompressorError(f"--scale-bits is one of {', '.join(map(str, SCALE_BITS))}, got {bits}")
    if bits != 16 and not any(weight_width(s) == 4 for s in schemes or ()):
        raise CompressorError("--scale-bits goes with a 4-bit --quantize scheme (int4, int4-aware, …, w4a8, mixed)")


def table_block_of(scheme: str, block: int, table_block: int | None = None) -> int:
    """The block of a 4-bit scheme's tables: `table_block` when given, else `block`, at least
    CORRECTED_TABLE_BLOCK for the corrected schemes."""
    if table_block is not None:
        return table_block
    return max(block, CORRECTED_TABLE_BLOCK) if scheme in CORRECTED else block


def weight_width(scheme: str | None) -> int | None:
    """The bits of a scheme's weights as the tools name graphs: None (fp32), 8, or 4 (mixed, which
    keeps some layers at 8, counts as 4)."""
    return None if scheme is None else 8 if scheme.startswith("int8") else 4
