"""Scores of a tied output head (Liu et al., normalised shared embeddings) and the row norms they
need, computed from whatever holds the table: ‖w_i‖ for all V rows without forming W.

With s_i = w_iᵀh the plain tied logit, the variants are
  dot       s_i                       (Press & Wolf)
  l2        s_i / ‖w_i‖, and the input lookup w_x / ‖w_x‖ too (unit rows at both ends)
  square    s_i / ‖w_i‖²              (the output row w_i / ‖w_i‖²)
  distance  s_i − ½‖w_i‖²             (−½‖h − w_i‖² up to a term constant in i)
  cosine    s_i / ‖w_i‖
"""

from torch import Tensor, nn

__all__ = ["SCORES", "NORM_FLOOR", "row_norms", "tied_scores", "normalised_lookup"]

SCORES = ("dot", "l2", "square", "distance", "cosine")
NORM_FLOOR = 1e-6  # a row of (nearly) zero norm is divided by this, not by 0


def row_norms(table: nn.Module) -> Tensor:
    """(V,) the Euclidean norm of every row of the table held by `table`: an nn.Embedding's weight,
    or a compact embedding's own `row_norms()` (from its factors)."""
    if isinstance(table, nn.Embedding):
        return table.weight.norm(dim=1)
    return table.row_norms()


def tied_scores(logits: Tensor, norms: Tensor, score: str) -> Tensor:
    """The tied head's output for `score` from the plain logits (..., V) and the row norms (V,)."""
    if score == "dot":
        return logits
    if score == "distance":
        return logits - 0.5 * norms.square()
    norms = norms.clamp_min(NORM_FLOOR)
    if score == "square":
        return logits / norms.square()
    if score in ("l2", "cosine"):
        return logits / norms
    raise ValueError(f"unknown tied score {score!r}; known: {', '.join(SCORES)}")


def normalised_lookup(module: nn.Module, args: tuple, kwargs: dict, output: Tensor) -> Tensor:
    """A forward hook on an input table: the looked-up rows divided by their norms (the `l2` score)."""
    ids = args[0] if args else next(iter(kwargs.values()))
    return output / row_norms(module).clamp_min(NORM_FLOOR)[ids].unsqueeze(-1).to(output.dtype)
