"""The output head of a language model whose input table W (V × D) also scores the next token:
logits = h Wᵀ, computed through whatever holds W (a dense nn.Embedding, or a compact embedding's
factors through its own `logits`), so that the table is stored once and never formed; optionally
rescored by the row norms (compressor.tying: Liu et al.'s normalised variants) and with a bias.

`matmul_t(x, w)` is x wᵀ exported as ONNX Runtime's FusedMatMul(x, w, transB=1): the exporter would
otherwise fold wᵀ into a second, transposed copy of the weight (the known pitfall of tied weights in
ONNX). A Gemm with transB stores it once too, but takes 2-D input only, and the Reshape back to
(batch, seq, V) costs a copy of the logits at the peak (64 MB at (8, 128) for a 16,384-token table)."""

import torch
from torch import Tensor, nn

from compressor.tying import SCORES, normalised_lookup, row_norms, tied_scores

__all__ = ["matmul_t", "table_logits", "TiedLogits"]


class _MatMulTransB(torch.autograd.Function):
    """x (..., D), w (V, D) → x wᵀ (..., V); in ONNX FusedMatMul(x, w, transB=1), w kept as stored."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor) -> Tensor:
        return x @ w.T

    @staticmethod
    def symbolic(g, x, w):
        return g.op("com.microsoft::FusedMatMul", x, w, transB_i=1)


def matmul_t(x: Tensor, w: Tensor) -> Tensor:
    """x (..., D) @ wᵀ, w (V, D) → (..., V); one FusedMatMul with transB when exported."""
    if not torch.onnx.is_in_onnx_export():
        return torch.matmul(x, w.T)
    return _MatMulTransB.apply(x, w)


def table_logits(table: nn.Module, h: Tensor) -> Tensor:
    """h (..., D) @ Wᵀ for the table W of `table`: an nn.Embedding's weight, or through a compact
    embedding's factors (its `logits`)."""
    if isinstance(table, nn.Embedding):
        return matmul_t(h, table.weight)
    return table.logits(h)


class TiedLogits(nn.Module):
    """The output projection of a tied model: logits = score(h Wᵀ) (+ b) with W the input
    embedding's table. It holds no weight of its own: the embedding is referenced, not registered as
    a submodule, so a state dict, a checkpoint and an ONNX graph hold the table (or its factors)
    once. With score "l2" the input lookup is normalised too, by a hook on the embedding that
    `release()` removes (call it before this head is replaced)."""

    def __init__(self, embedding: nn.Module, score: str = "dot", bias: Tensor | None = None):
        super().__init__()
        if score not in SCORES:
            raise ValueError(f"unknown tied score {score!r}; known: {', '.join(SCORES)}")
        self._table = (embedding,)  # a tuple: nn.Module does not register what it holds
        self.score = score
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        self._hook = embedding.register_forward_hook(normalised_lookup, with_kwargs=True) if score == "l2" else None

    def release(self) -> None:
        """Remove the input normalisation hook (score "l2") from the embedding."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    @property
    def embedding(self) -> nn.Module:
        return self._table[0]

    @property
    def weight(self) -> Tensor:
        """The dense table (V × D), formed for checks only when the embedding is compact."""
        table = self.embedding
        return table.weight if isinstance(table, nn.Embedding) else table.to_dense()

    def forward(self, h: Tensor) -> Tensor:
        logits = table_logits(self.embedding, h)  # (..., V)
        if self.score != "dot":
            logits = tied_scores(logits, row_norms(self.embedding).to(logits.dtype), self.score)
        return logits if self.bias is None else logits + self.bias

    def extra_repr(self) -> str:
        return f"tied to {type(self.embedding).__name__}, score={self.score}, bias={self.bias is not None}"
