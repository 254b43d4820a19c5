"""An embedding table held as a DeFINE unit (map, expand, reduce): token t's row is

    R · HGT(e_t) + b,   e_t = row t of a V × n map table,

the HGT (compressor.define) widening n to k through N group linear layers, each followed by a GELU,
with the mixer before every layer after the first, and R (k × m) the reduce. A row depends on its
token alone, so the unit can also be evaluated once for every token and shipped as a table.

Each layer's weight and bias, and the reduce's, are stored divided by a fixed scale (a buffer) so
that every stored tensor has the map's rms entry: a fine-tune's one learning rate then moves each
by the same relative step (a GELU leaves no exact gauge to balance them by, as TT cores are)."""

from dataclasses import asdict, dataclass, replace

import torch
from torch import Tensor, nn
from torch.nn import functional

from compressor.compact_embedding import CompactEmbedding
from compressor.define import CHUNK, HGTSchedule, group_linear, hgt_schedule, mix
from compressor.define_fit import fit_define
from compressor.tied_logits import matmul_t

__all__ = ["DefineEmbedding", "DefineEmbeddingSpec"]


@dataclass(frozen=True)
class DefineEmbeddingSpec:
    num_embeddings: int
    embedding_dim: int
    n: int  # the map's width
    k: int  # the widest HGT layer
    layers: int  # N
    max_groups: int  # g_max: groups of the first layer, halved at each next one

    def __post_init__(self):
        hgt_schedule(self.n, self.k, self.layers, self.max_groups)  # raises on widths its groups do not divide

    @property
    def schedule(self) -> HGTSchedule:
        return hgt_schedule(self.n, self.k, self.layers, self.max_groups)

    def params(self) -> int:
        """V·n (the map) + the HGT's weights and biases + k·m + m (the reduce)."""
        return self.num_embeddings * self.n + self.schedule.params() + (self.k + 1) * self.embedding_dim

    def to_dict(self) -> dict:
        return asdict(self)


class DefineEmbedding(CompactEmbedding):
    """In ONNX: one Gather from the V×n map, then per layer a Concat (the mixer), a batched MatMul,
    an Add and a GELU, and one MatMul for the reduce."""

    spec_type = DefineEmbeddingSpec

    def __init__(self, spec: DefineEmbeddingSpec):
        super().__init__()
        self.spec = spec
        s = spec.schedule
        self.map = nn.Parameter(torch.zeros(spec.num_embeddings, spec.n))  # E (V, n)
        self.weights = nn.ParameterList(
            nn.Parameter(torch.zeros(g, s.inputs(i) // g, o // g))
            for i, (o, g) in enumerate(zip(s.widths[1:], s.groups))
        )  # W_l (g_l, in_l / g_l, o_l / g_l)
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(o)) for o in s.widths[1:])
        self.reduce = nn.Parameter(torch.zeros(spec.k, spec.embedding_dim))  # R (k, m)
        self.reduce_bias = nn.Parameter(torch.zeros(spec.embedding_dim))
        self.register_buffer("scales", torch.ones(spec.layers + 1))  # of the N layers, then of the reduce

    @classmethod
    def from_weight(cls, weight: Tensor, n: int, k: int = 1024, layers: int = 3, max_groups: int = 4, **fit):
        """A unit fitted to a (V, m) table by compressor.define_fit.fit_define (`fit`: its row
        weights, output sensitivity, steps and seed)."""
        spec = DefineEmbeddingSpec(weight.shape[0], weight.shape[1], n, k, layers, max_groups)
        return fit_define(cls(spec).to(device=weight.device, dtype=weight.dtype), weight, **fit)

    def expand(self, e: Tensor) -> Tensor:
        """The HGT: map rows e (N, n) → (N, k)."""
        x = e
        for layer, (weight, bias, scale) in enumerate(zip(self.weights, self.biases, self.scales)):
            if layer > 0:
                x = mix(e, x, weight.shape[0])  # (N, n + o_{l−1})
            x = functional.gelu(group_linear(x, weight * scale) + bias * scale)  # (N, o_l)
        return x

    def unit(self, e: Tensor) -> Tensor:
        """Map rows e (N, n) → the unit's outputs (N, m)."""
        scale = self.scales[-1]
        return torch.matmul(self.expand(e), self.reduce * scale) + self.reduce_bias * scale

    def to_dense(self) -> Tensor:
        """The (V, m) table: the unit on every map row."""
        return torch.cat([self.unit(rows) for rows in self.map.split(CHUNK)])

    def forward(self, ids: Tensor) -> Tensor:
        rows = self.map[ids.reshape(-1)]  # (N, n)
        return self.unit(rows).reshape(*ids.shape, self.embedding_dim)

    def logits(self, h: Tensor) -> Tensor:
        """h Wᵀ with W the unit's output for every token: a nonlinear unit has no cheaper product, so
        the table is formed (ONNX Runtime folds it into a constant: the cached form)."""
        return matmul_t(h, self.to_dense())

    def row_norms(self) -> Tensor:
        """The norm of every token's output: a nonlinear unit has no shortcut, so the outputs are
        formed (its cached form), as `logits` does."""
        return self.to_dense().norm(dim=1)

    def rows(self, ids: Tensor) -> "DefineEmbedding":
        """The same unit over the map rows of `ids` only (token i of the new one is ids[i])."""
        module = type(self)(replace(self.spec, num_embeddings=len(ids))).to(
            device=self.map.device, dtype=self.map.dtype
        )
        state = {name: t for name, t in self.state_dict().items() if name != "map"}
        module.load_state_dict({**state, "map": self.map.detach()[ids]})
        return module

    def extra_repr(self) -> str:
        s = self.spec
        return f"{s.num_embeddings}, {s.embedding_dim}, n={s.n}, k={s.k}, layers={s.layers}, max_groups={s.max_groups}"
