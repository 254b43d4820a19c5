"""Typed errors: each message states the rule that was broken, then the value that broke it."""

__all__ = [
    "CompressorError",
    "PlanError",
    "RankError",
    "ShapeError",
    "ExportParityError",
    "UnmatchedWeightError",
    "OutOfSpaceError",
]


class CompressorError(ValueError):
    """Base of every error the toolkit raises on bad input; the CLI prints its message alone."""


class PlanError(CompressorError):
    """A plan that names a module the model lacks, an unknown method, or an unsupported module."""


class RankError(CompressorError):
    """A rank that is not a positive integer, or an error tolerance outside (0, 1)."""


class ShapeError(CompressorError):
    """A dimension that does not factor or a tensor whose shape does not match its spec."""


class ExportParityError(CompressorError):
    """ONNX Runtime and PyTorch disagree by more than the tolerance on the same inputs."""


class UnmatchedWeightError(CompressorError):
    """A weight of a graph that no single module of the PyTorch model holds (a student cannot be built)."""


class OutOfSpaceError(CompressorError):
    """The disk has too little space for an output; not the input's fault, so the CLI exits 1."""

    exit_code = 1
