"""How a quantized graph stores its codes and scales: packed codes unpacked by folded nodes, fp16 and one-byte
block scales, codebook tables, a tied table's codes stored once."""

__all__ = ["packed_codes", "half_scales", "byte_scales", "codebook_table", "tied_codes"]
