"""The hybrid form of a DeFINE unit (DeFINE, Mehta et al. 2020, §3): the unit's outputs for the K most frequent
tokens cached as rows (the head), the unit itself kept for the others (the tail), so that most
tokens cost one Gather and only the rare ones the HGT: row(t) = head[p] if p < K else unit(e_{p−K}),
p = perm[t]."""

import torch
from torch import Tensor, nn

from compressor.define_embedding import DefineEmbedding
from compressor.head_tail import HeadTailEmbedding

__all__ = ["HybridEmbedding"]


class HybridEmbedding(HeadTailEmbedding):
    """A head-tail embedding whose tail runs on the tail tokens alone: in ONNX a Gather of the head
    for every token, then NonZero picks the tail tokens, the unit runs on them, and ScatterND writes
    their rows."""

    @classmethod
    def from_unit(cls, unit: DefineEmbedding, head_tokens: Tensor) -> "HybridEmbedding":
        """The unit with the outputs of `head_tokens` (K distinct ids) cached; equal to it on every token."""
        with torch.no_grad():
            table = nn.Embedding.from_pretrained(unit.to_dense())
        return cls.from_embedding(table, head_tokens, lambda weight, ids: unit.rows(ids))

    def forward(self, ids: Tensor) -> Tensor:
        k = self.spec.head_size
        pos = self.permutation[ids.reshape(-1)]  # (N,)
        rows = self.head[pos.clamp(max=k - 1)]  # (N, m): the cached rows, right for head tokens
        rare = torch.nonzero(pos >= k).squeeze(1)  # (R,) where the tail tokens sit
        # one spare row, so that the unit never runs on 0 rows: ONNX Runtime's fused Reshapes cannot infer a
        # −1 of an empty tensor
        computed = self.tail(torch.cat([pos[rare] - k, pos.new_zeros(1)]))[:-1]  # (R, m)
        rows = rows.index_put((rare,), computed)
        return rows.reshape(*ids.shape, self.embedding_dim)
