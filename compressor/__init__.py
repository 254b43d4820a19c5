"""Decompositions (pure functions on tensors) and the compact modules built from them.

The names below load on first use (PEP 562), so that `compressor.errors` imports without PyTorch: a run's stages
after the export (rounding ONNX graphs, the bench) run in a process that never loads it."""

from compressor.lazy_names import lazy_names

__getattr__, __all__ = lazy_names(
    __name__,
    {
        "CompressorError": "compressor.errors",
        "ExportParityError": "compressor.errors",
        "PlanError": "compressor.errors",
        "RankError": "compressor.errors",
        "ShapeError": "compressor.errors",
        "TTEmbedding": "compressor.tt_embedding",
        "TTEmbeddingSpec": "compressor.tt_embedding",
        "balanced_factors": "compressor.factorize",
        "principal_order": "compressor.token_order",
        "tt_matrix_svd": "compressor.tt",
        "tt_matrix_to_dense": "compressor.tt",
    },
)
