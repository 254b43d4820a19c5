"""int8-aware-table: int8-aware's linear layers, the word table in 3 or 4 bits. An encoder's word table is about
half of its int8 file (MiniLM: 11.7 M of its 22.6 M weights) and is only looked up, never multiplied: its rows in
`table_bits` (asymmetric blocks of `table_block`; 3: two bit planes, three_bit_table), the `table_head` most
frequent tokens' rows wider (8 bits beside a 4-bit tail, 4 beside a 3-bit one), cost a gather of a few rows a
token, while every product stays int8 (no codes folded at session start, so the process holds what int8's does).
On MiniLM: 0.73× int8's file, 0.95× its peak RSS, recall@10 0.931 / 0.924 against 0.906 / 0.915, p50 1.07×
and 1.10× at (1,16) t1 and (8,128) t2 (docs/lab-notes/2026-11-28-deployment.md)."""

from dataclasses import dataclass

import onnx

from compressor.errors import CompressorError
from converters.options import option_field
from converters.quantization.registry import QuantizeResult, Source, register
from converters.quantization.rounding.int4 import check_int4_options, name_nodes, quantize_tables, table_gathers
from converters.quantization.rounding.table_head import TABLE_HEAD, frequent_ids, word_table
from converters.quantization.schemes.int4 import TABLE_BLOCK
from converters.quantization.schemes.int4_aware import TABLE_BITS, TABLE_BITS_OPTION, TABLE_HEAD_OPTION
from converters.quantization.schemes.int8_aware import Int8AwareConfig
from eval.kinds import GraphKind

__all__ = ["Int8AwareTableConfig"]


@register
@dataclass(frozen=True)
class Int8AwareTableConfig(Int8AwareConfig):
    """int8-aware with the word table in `table_bits` (blocks of `table_block`), its `table_head` most frequent
    rows wider."""

    scheme = "int8-aware-table"
    summary = "int8-aware, the word table in 3 or 4 bits (encoders)"
    table_bits: float = option_field(3, TABLE_BITS_OPTION)
    table_head: int = option_field(TABLE_HEAD, TABLE_HEAD_OPTION)
    table_block: int = option_field(32, TABLE_BLOCK)

    def __post_init__(self):
        super().__post_init__()
        if self.table_bits not in TABLE_BITS:
            raise CompressorError(f"--table-bits is one of {', '.join(map(str, TABLE_BITS))}, got {self.table_bits:g}")
        if self.table_head < 0:
            raise CompressorError(f"--table-head is a number of table rows, 0 or more, got {self.table_head}")
        check_int4_options(self.table_block)

    @property
    def head_rows(self) -> int:
        return self.table_head

    def check(self, kind: GraphKind) -> None:
        """An encoder's (a `kind` whose products are int8): an LM's tied head multiplies by its table."""
        if kind.factor_form != "int8":
            raise CompressorError(f"{self.scheme} narrows an encoder's word table; an LM's head multiplies by it")

    def smoothed(self, source: Source) -> tuple[onnx.ModelProto, dict]:
        """int8-aware's smoothed graph with its word table in `table_bits` (GatherBlockQuantized, or 3-bit planes):
        quantize_dynamic then rounds its MatMuls and its other tables, in int8 as int8's. A position table in
        GatherBlockQuantized costs 45 µs a call at (1,16) whatever the rows it reads (MiniLM, 3 % of its p50), one
        in int8 nothing to speak of; its 4 bits would save MiniLM 0.1 MB."""
        model, outlying = super().smoothed(source)
        name_nodes(model.graph)
        head = frequent_ids(source.calibration, source.vocab, self.table_head, source.frequencies)
        head = head if len(head) else None
        word = word_table(model.graph, table_gathers(model.graph), 1)
        if word is None:
            raise CompressorError(
                f"{self.scheme} narrows the word table, and this graph reads none (a 2-D table gathered by the input "
                "ids): use int8-aware"
            )
        narrowed = quantize_tables(model, self.table_block, True, only=(word.name,), head=head, bits=self.table_bits)
        return narrowed, outlying

    def report(self, result: QuantizeResult) -> dict:
        figures = {"table_bits": result.table_bits, "table_head": self.table_head, "table_block": self.table_block}
        return {**super().report(result), **figures}
