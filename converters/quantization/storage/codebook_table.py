"""A table in 2, 1.33 or 1 bits a weight by product quantization (Jégou et al. 2011): each row cut into D / p pieces
of p = 8 / bits weights (4, 6, 8), piece j replaced by the nearest of 256 centroids C_j (k-means over that piece of
every row), so a row is D / p one-byte codes, w ≈ [C_0[c_0], …, C_{D/p−1}[c_{D/p−1}]], and the table's codebooks
(256 · D weights, half precision) are shared by all rows. At the bytes of a 2-bit round to nearest it keeps what a
table's rows share: on MiniLM's word table (the 4,096 most frequent rows in 4 bits, the rest so coded; the table
alone) recall@10 0.942 / 0.898 against 2-bit rounding's 0.936 / 0.857 and 3-bit's 0.943 / 0.926 (BENCHMARKS.md,
"The word table's tail in codebooks").

The lookup is standard operators: codes = Gather(C, ids), index = codes + 256 · j, Gather(codebooks, index), cast
and reshaped to (…, D). PyTorch (its cdist) is imported where a table is coded: reading a coded graph (codebook_bits,
at every quantization) needs numpy alone."""

import numpy as np
import onnx
from tqdm.auto import tqdm

from compressor.errors import CompressorError
from converters.quantization.storage.packed_codes import Builder, default_opset, replace_gather
from files.onnx_files import weight_array

__all__ = [
    "CODEBOOK_BITS",
    "CENTROIDS",
    "CODEBOOK_PARTS",
    "codebook_gather",
    "codebook_rows",
    "codebook_outputs",
    "codebook_bits",
    "piece_of",
    "kmeans",
]

CODEBOOK_BITS = (2, 1.33, 1)  # widths a weight: a one-byte code for 8 / bits weights (4, 6, 8)
CENTROIDS = 256  # a codebook's entries
CODEBOOK_PARTS = ("PQcodes", "PQbooks")  # initializers OUT_part of a codebook lookup
_ITERATIONS = 20  # of Lloyd's k-means; 60 lower MiniLM's tail's error by 0.4 % and keep no more recall (BENCHMARKS)


def _nearest(pieces, centroids):
    """(m, n) the index of each piece's nearest centroid (tensors), a few spaces at a time (distance matrices of about
    2^25 floats, 128 MB, whatever the table's rows)."""
    import torch

    spaces = max(1, (1 << 25) // (pieces.shape[1] * centroids.shape[1]))
    return torch.cat(
        [
            torch.cdist(pieces[j : j + spaces], centroids[j : j + spaces]).argmin(-1)
            for j in range(0, len(pieces), spaces)
        ]
    )


def kmeans(pieces, k: int = CENTROIDS, iterations: int = _ITERATIONS) -> tuple[np.ndarray, np.ndarray]:
    """(centroids (m, k, p) float16, codes (n, m) uint8) of `pieces` (m, n, p), a tensor: Lloyd's k-means in each of
    the m spaces (k at most n), started from k rows drawn without replacement (seeded), an emptied centroid left where
    it was; the codes last chosen against the centroids in half precision, as they are stored."""
    import torch

    m, n, p = pieces.shape
    k = min(k, n)
    start = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:k]
    centroids = pieces[:, start].clone()
    for _ in tqdm(range(iterations), desc=f"a table's codebooks, k-means in {m} spaces", leave=False):
        codes = _nearest(pieces, centroids)
        counts = torch.zeros(m, k).scatter_add_(1, codes, torch.ones(m, n))
        sums = torch.zeros(m, k, p).scatter_add_(1, codes[..., None].expand(-1, -1, p), pieces)
        centroids = torch.where(counts[..., None] > 0, sums / counts.clamp(min=1)[..., None], centroids)
    centroids = centroids.half()
    return centroids.numpy(), _nearest(pieces, centroids.float()).T.numpy().astype(np.uint8)


def _coded(weight: np.ndarray, piece: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes (rows, D / piece) uint8, codebooks (D / piece · k, piece) float16, k at most CENTROIDS) of `weight`."""
    import torch

    rows, cols = weight.shape
    pieces = torch.from_numpy(weight.reshape(rows, cols // piece, piece).transpose(1, 0, 2).copy())
    with torch.no_grad():
        centroids, codes = kmeans(pieces)
    return codes, centroids.reshape(-1, piece)


def piece_of(bits: float) -> int:
    """The weights a one-byte code stands for at `bits` (CODEBOOK_BITS) a weight."""
    return round(8 / bits)


def codebook_gather(model: onnx.ModelProto, name: str, bits: float) -> None:
    """The Gather node `name` of a 2-D fp32 table (in place) as the codebook lookup of `bits` (CODEBOOK_BITS) a
    weight (module docstring), its output unchanged; its table removed when no other node reads it."""
    graph = model.graph
    node = next(n for n in graph.node if n.name == name)
    inits = {i.name: i for i in graph.initializer}
    weight = weight_array(inits[node.input[0]]).astype(np.float32)
    rows, cols = weight.shape
    piece = piece_of(bits)
    if cols % piece:
        raise CompressorError(f"a codebook table's rows split into pieces of {piece} weights; {cols} do not")
    codes, books = _coded(weight, piece)
    out = node.output[0]
    b = Builder(out, default_opset(model))
    flat = b.op("Reshape", [node.input[1], b.const([-1], np.int64)])
    picked = b.op("Cast", [b.op("Gather", [f"{out}_{CODEBOOK_PARTS[0]}", flat])], to=onnx.TensorProto.INT64)
    index = b.op("Add", [picked, b.const(np.arange(cols // piece) * (len(books) * piece // cols), np.int64)])
    values = b.op("Cast", [b.op("Gather", [f"{out}_{CODEBOOK_PARTS[1]}", index])], to=onnx.TensorProto.FLOAT)
    replace_gather(graph, node, b, values, dict(zip(CODEBOOK_PARTS, (codes, books))))


def codebook_rows(graph: onnx.GraphProto, out: str) -> np.ndarray | None:
    """The table (rows × D, float32) the codebook lookup of output `out` reads its rows from, as the graph computes
    them; None when `out` is no such lookup's."""
    inits = {i.name: i for i in graph.initializer}
    if not all(f"{out}_{part}" in inits for part in CODEBOOK_PARTS):
        return None
    codes, books = (weight_array(inits[f"{out}_{part}"]) for part in CODEBOOK_PARTS)
    index = codes.astype(np.int64) + np.arange(codes.shape[1]) * (len(books) // codes.shape[1])
    return books[index].astype(np.float32).reshape(codes.shape[0], -1)


def codebook_outputs(graph: onnx.GraphProto) -> set[str]:
    """The outputs of the codebook lookups in `graph`."""
    suffix = f"_{CODEBOOK_PARTS[0]}"
    return {i.name.removesuffix(suffix) for i in graph.initializer if i.name.endswith(suffix)}


def codebook_bits(graph: onnx.GraphProto) -> float | None:
    """The bits a weight (CODEBOOK_BITS) of the codebook lookups in `graph`, from their pieces' length; None when it
    has none."""
    inits = {i.name: i for i in graph.initializer}
    pieces = {inits[f"{out}_{CODEBOOK_PARTS[1]}"].dims[1] for out in codebook_outputs(graph)}
    return next(b for b in CODEBOOK_BITS if piece_of(b) == max(pieces)) if pieces else None
