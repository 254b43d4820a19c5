"""Decompositions (pure functions on tensors) and the compact modules built from them."""

from compressor.errors import CompressorError, ExportParityError, PlanError, RankError, ShapeError
from compressor.factorize import balanced_factors
from compressor.token_order import principal_order
from compressor.tt import tt_matrix_svd, tt_matrix_to_dense
from compressor.tt_embedding import TTEmbedding, TTEmbeddingSpec

__all__ = [
    "CompressorError",
    "ExportParityError",
    "PlanError",
    "RankError",
    "ShapeError",
    "TTEmbedding",
    "TTEmbeddingSpec",
    "balanced_factors",
    "principal_order",
    "tt_matrix_svd",
    "tt_matrix_to_dense",
]
