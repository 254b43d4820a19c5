"""The rounding error's corrections and the budgets that spend bytes on them: low-rank corrections and their
plan, each layer's loss in 4 bits, widths under a byte budget, int8 products of a corrected layer, and the
training of the corrections through the rounding (its students)."""

__all__ = [
    "correction",
    "correction_plan",
    "sensitivity",
    "mixed",
    "int8_products",
    "training",
    "fused_student",
    "tied_student",
    "graph_norms",
]
