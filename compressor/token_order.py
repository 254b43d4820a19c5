"""Token orders chosen before a TT-SVD: which row of the TT table each token occupies.

A TT-matrix with d cores indexes its rows by (i_1,…,i_d); rows sharing i_1 share the first
core's slice. Sorting tokens so that similar rows share slices lowers the error that matters.
"""

import math

import torch
from torch import Tensor

__all__ = ["principal_order", "TOKEN_ORDERS"]

TOKEN_ORDERS = ("none", "pca")


def principal_order(weight: Tensor, row_dims: tuple[int, ...]) -> Tensor:
    """Permutation p (token → row) from a hierarchical sort by principal coordinates: tokens are
    sorted by their 1st principal coordinate and cut into v_1 blocks (one per i_1), each block
    sorted by the 2nd coordinate and cut into v_2 blocks, and so on."""
    w = weight.detach().to(torch.float64)
    w = w - w.mean(0)
    _, _, vh = torch.linalg.svd(w, full_matrices=False)
    scores = w @ vh[: len(row_dims)].T  # (V, d) principal coordinates

    blocks = [torch.arange(w.shape[0])]  # tokens, in their final order, block by block
    for k, v_k in enumerate(row_dims[:-1]):
        block_rows = math.prod(row_dims[k + 1 :])  # rows that share one index i_k
        nxt = []
        for tokens in blocks:
            tokens = tokens[torch.argsort(scores[tokens, k], stable=True)]
            nxt.extend(tokens.split(block_rows))
        blocks = nxt
    order = torch.cat([b[torch.argsort(scores[b, -1], stable=True)] for b in blocks])
    permutation = torch.empty_like(order)
    permutation[order] = torch.arange(len(order))
    return permutation
