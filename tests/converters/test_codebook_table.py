"""The word table by codebook (product quantization): the lookup gathers exactly the rows `codebook_rows` reads
(what the training holds); a table of at most 256 rows comes back exact, and each piece of a larger one at its
nearest centroid; a byte a code of 8 / bits weights and the codebooks in
half precision; with a head, the head in 4 bits and the tail coded."""

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from compressor.errors import CompressorError
from converters.quantization.registry import check_options, scheme_named
from converters.quantization.rounding.int4 import quantize_tables
from converters.quantization.storage.codebook_table import (
    CODEBOOK_PARTS,
    codebook_bits,
    codebook_rows,
    kmeans,
    piece_of,
)
from eval.graph import make_session
from tests.conftest import gather_graph

ROWS, COLS, BLOCK = 600, 96, 32  # pieces of 4, 6 and 8 weights


def _run(model, tmp_path, ids):
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path))
    return make_session(path).run(None, {"input_ids": ids})[0]


def _stored(model) -> int:
    return sum(numpy_helper.to_array(i).nbytes for i in model.graph.initializer if i.name.endswith(CODEBOOK_PARTS))


@pytest.mark.parametrize("bits", [2, 1.33, 1])
def test_the_lookup_gathers_the_rows_the_training_holds(tmp_path, bits):
    model, table = gather_graph(ROWS, COLS)
    model = quantize_tables(model, BLOCK, aware=True, bits=bits)
    assert not [i for i in model.graph.initializer if i.name == "table"]  # no fp32 copy left
    ids = np.random.default_rng(1).integers(0, ROWS, size=(3, 9))
    rows = _run(model, tmp_path, ids)
    held = codebook_rows(model.graph, "rows")
    assert codebook_bits(model.graph) == bits
    assert rows.shape == (3, 9, COLS) and np.array_equal(rows, held[ids])  # bit for bit
    piece = piece_of(bits)
    assert _stored(model) == ROWS * COLS // piece + 256 * COLS * 2  # a byte a piece, fp16 codebooks
    # each piece at (about) its nearest centroid: no other entry of its codebook is nearer by more than fp16 allows
    books = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "rows_PQbooks"))
    books = books.astype(np.float32).reshape(COLS // piece, 256, piece)
    pieces = table.reshape(ROWS, COLS // piece, piece)
    chosen = np.linalg.norm(pieces - held.reshape(pieces.shape), axis=-1)
    nearest = np.linalg.norm(pieces[:, :, None] - books[None], axis=-1).min(-1)
    assert np.all(chosen <= nearest + 1e-5)
    error = np.linalg.norm(held - table) / np.linalg.norm(table)
    assert 0.05 < error < {2: 0.6, 1.33: 0.75, 1: 0.85}[bits]  # coded, not copied, and better than no table at all


@pytest.mark.parametrize("rows", [256, 100])
def test_a_table_of_at_most_256_rows_comes_back_exact(rows):
    pieces = torch.from_numpy(np.random.default_rng(0).standard_normal((8, rows, 4)).astype(np.float16)).float()
    centroids, codes = kmeans(pieces)
    assert centroids.shape == (8, rows, 4)
    rebuilt = np.take_along_axis(centroids, codes.T.astype(np.int64)[..., None], axis=1).astype(np.float32)
    assert np.array_equal(rebuilt, pieces.numpy())


def test_a_head_in_four_bits_and_the_tail_coded(tmp_path):
    model, table = gather_graph(ROWS, COLS)
    head = np.arange(0, ROWS, 5)
    model = quantize_tables(model, BLOCK, aware=True, head=head, bits=2)
    assert any(n.op_type == "GatherBlockQuantized" for n in model.graph.node)  # the head's 4 bits
    rows = _run(model, tmp_path, np.arange(ROWS, dtype=np.int64)[None])[0]
    is_head = np.isin(np.arange(ROWS), head)
    assert np.array_equal(rows[~is_head], codebook_rows(model.graph, "rows_tail"))  # in token order
    head_error = np.abs(rows[is_head] - table[is_head]).mean()
    tail_error = np.abs(rows[~is_head] - table[~is_head]).mean()
    assert head_error < 0.8 * tail_error  # 4 bits against 2 (on 480 rows, 256 centroids a piece)


def test_widths_are_checked():
    with pytest.raises(CompressorError, match="one of 4, 3, 2, 1.33, 1"):
        scheme_named("w4a8")(table_bits=5)
    with pytest.raises(CompressorError, match="--table-bits 2 is for an encoder"):
        scheme_named("int4-aware")(table_bits=2).check(type("Kind", (), {"factor_form": "nbits"})())
    with pytest.raises(CompressorError, match="goes with --quantize .*int4-aware"):
        check_options(["int8"], {"table_bits": 1})


def test_a_table_whose_rows_do_not_split_into_pieces_stays_in_four_bits():
    model, _ = gather_graph(ROWS, 64)  # 64 weights a row: blocks of 32, but no whole pieces of 6
    model = quantize_tables(model, BLOCK, aware=True, bits=1.33)
    assert codebook_bits(model.graph) is None
    assert [n.op_type for n in model.graph.node] == ["GatherBlockQuantized"]
