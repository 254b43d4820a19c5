"""Token orders chosen before a TT-SVD: which row of the TT table each token occupies.

A TT-matrix indexes its rows by (i_1,…,i_d), p = Σ_k i_k Π_{j>k} v_j, so rows close in p share
their leading indices and with them the leading cores' slices. Placing similar tokens at nearby
rows makes the reshaped table closer to low TT rank.
"""

import torch
from torch import Tensor

__all__ = ["principal_order", "TOKEN_ORDERS"]

TOKEN_ORDERS = ("none", "pca")
LEAF = 8  # groups this small keep their incoming order


def _leading_direction(x: Tensor, iters: int = 20) -> Tensor:
    """Top right singular vector of x by power iteration from a fixed start (deterministic)."""
    v = torch.ones(x.shape[1], dtype=x.dtype) / x.shape[1] ** 0.5
    v = v + 1e-3 * torch.arange(x.shape[1], dtype=x.dtype)  # not orthogonal to a structured top vector
    for _ in range(iters):
        v = x.T @ (x @ v)
        v = v / v.norm().clamp_min(1e-30)
    return v


def principal_order(weight: Tensor) -> Tensor:
    """Permutation p (token → row) from recursive bisection: sort a group of tokens by their
    coordinate on the group's own leading principal direction, split at the median, recurse;
    rows are the leaves in order, so similar tokens sit at nearby rows at every scale."""
    w = weight.detach().to(torch.float64)
    order, stack = [], [torch.arange(w.shape[0])]
    while stack:
        group = stack.pop()
        if len(group) <= LEAF:
            order.append(group)
            continue
        x = w[group] - w[group].mean(0)
        group = group[torch.argsort(x @ _leading_direction(x), stable=True)]
        half = len(group) // 2
        stack += [group[half:], group[:half]]  # the lower half is taken first
    order = torch.cat(order)
    permutation = torch.empty_like(order)
    permutation[order] = torch.arange(len(order))
    return permutation
