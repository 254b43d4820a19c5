"""How weights are rounded: the graph's products as MatMuls, SmoothQuant, 4-bit blocks (int4, GPTQ, 4-bit grids),
3-bit linear layers and tables, the word table's frequent rows wider, and the int8 range of a CPU."""

__all__ = [
    "products",
    "smoothing",
    "int4",
    "gptq",
    "grid",
    "three_bit_linear",
    "three_bit_table",
    "table_head",
    "tied_head",
    "target_cpu",
]
