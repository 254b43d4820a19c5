"""An embedding whose K most frequent tokens keep exact rows (the head) while the rest (the
tail) are held by a compact module: row(t) = head[p] if p < K else tail(p − K), p = perm[t]."""

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from compressor.compact_embedding import CompactEmbedding
from compressor.errors import ShapeError
from compressor.tied_logits import matmul_t

__all__ = ["HeadTailEmbedding", "HeadTailSpec"]


@dataclass(frozen=True)
class HeadTailSpec:
    num_embeddings: int
    embedding_dim: int
    head_size: int
    tail_type: str
    tail_spec: dict[str, Any]

    def __post_init__(self):
        if not 0 < self.head_size < self.num_embeddings:
            raise ShapeError(f"the dense head must hold 1 to {self.num_embeddings - 1} rows, got {self.head_size}")
        tails = CompactEmbedding.types
        if self.tail_type not in tails:
            raise ShapeError(f"unknown tail type {self.tail_type!r}; known: {', '.join(tails)}")

    def to_dict(self) -> dict:
        return asdict(self)


class HeadTailEmbedding(CompactEmbedding):
    """Head rows are bit-exact; in ONNX: a Gather of the permutation, a Gather of the head, the
    tail's own lookup, and one Where."""

    spec_type = HeadTailSpec

    def __init__(self, spec: HeadTailSpec):
        super().__init__()
        self.spec = spec
        tail_cls = CompactEmbedding.types[spec.tail_type]
        self.tail = tail_cls(tail_cls.spec_type(**spec.tail_spec))
        self.head = nn.Parameter(torch.zeros(spec.head_size, spec.embedding_dim))
        self.register_buffer("permutation", torch.arange(spec.num_embeddings))

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, head_tokens: Tensor, build_tail) -> "HeadTailEmbedding":
        """`head_tokens` (K distinct ids) keep their rows; `build_tail(tail_weight, tail_ids)` returns
        the compact module for the other rows, given in increasing id order."""
        weight = embedding.weight.detach()
        num = weight.shape[0]
        head_tokens = torch.as_tensor(head_tokens, dtype=torch.long)
        if len(set(head_tokens.tolist())) != len(head_tokens) or not bool(
            ((head_tokens >= 0) & (head_tokens < num)).all()
        ):
            raise ShapeError(f"head tokens must be distinct ids in [0, {num})")
        is_head = torch.zeros(num, dtype=torch.bool)
        is_head[head_tokens] = True
        tail_ids = (~is_head).nonzero().squeeze(1)
        tail = build_tail(weight[tail_ids], tail_ids)
        spec = HeadTailSpec(num, weight.shape[1], len(head_tokens), type(tail).__name__, tail.spec.to_dict())
        module = cls(spec).to(device=weight.device, dtype=weight.dtype)
        module.tail = tail
        with torch.no_grad():
            module.head.copy_(weight[head_tokens])
            module.permutation[head_tokens] = torch.arange(len(head_tokens))
            module.permutation[tail_ids] = torch.arange(len(tail_ids)) + len(head_tokens)
        return module

    def to_dense(self) -> Tensor:
        rows = torch.cat([self.head, self.tail.to_dense()])  # in position order
        return rows[self.permutation]

    def forward(self, ids: Tensor) -> Tensor:
        k = self.spec.head_size
        pos = self.permutation[ids]
        head = self.head[pos.clamp(max=k - 1)]  # (..., D)
        tail = self.tail((pos - k).clamp(min=0))  # (..., D)
        return torch.where((pos < k).unsqueeze(-1), head, tail)

    def logits(self, h: Tensor) -> Tensor:
        """h Wᵀ: the head rows' scores exactly, the tail's through its factors, then in token order.
        The reordering gathers whole rows of the transposed scores: ONNX Runtime's Gather along the
        last axis of (N, V) was 10× slower than a row Gather and two Transposes."""
        by_position = torch.cat([matmul_t(h, self.head), self.tail.logits(h)], dim=-1)  # (..., V)
        rows = by_position.reshape(-1, self.num_embeddings).T  # (V, N), in position order
        return rows[self.permutation].T.reshape(by_position.shape)  # (..., V), in token order

    def row_norms(self) -> Tensor:
        """The head rows' norms exactly, the tail's from its factors, in token order."""
        return torch.cat([self.head.norm(dim=1), self.tail.row_norms()])[self.permutation]  # (V,)

    def extra_repr(self) -> str:
        return f"{self.spec.num_embeddings}, {self.spec.embedding_dim}, head={self.spec.head_size}"
