"""What every compact embedding shares: its table's shape (V, D) is read from its spec, and every
subclass is known by its class name (a head-tail embedding rebuilds its tail by that name)."""

from typing import ClassVar

from torch import nn

__all__ = ["CompactEmbedding"]


class CompactEmbedding(nn.Module):
    """Base of the embedding modules that never hold their (V, D) table; `self.spec` carries
    num_embeddings and embedding_dim, as nn.Embedding's attributes of the same names do."""

    types: ClassVar[dict[str, type["CompactEmbedding"]]] = {}  # every subclass, by class name

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        CompactEmbedding.types[cls.__name__] = cls

    @property
    def num_embeddings(self) -> int:
        return self.spec.num_embeddings

    @property
    def embedding_dim(self) -> int:
        return self.spec.embedding_dim
