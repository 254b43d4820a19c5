"""The word table by frequency: the split lookup is exact in fp32, the head's 8-bit rows are within half
an 8-bit step and the tail's within half a 4-bit step, the head is the calibration text's most frequent
tokens, and bad heads are refused."""

import numpy as np
import onnx
import pytest

from compressor.errors import CompressorError
from converters.quantization.registry import check_options, scheme_named
from converters.quantization.rounding.int4 import quantize_tables
from converters.quantization.rounding.table_head import frequent_ids, split_table, split_tables
from eval.graph import make_session
from tests.conftest import gather_graph

ROWS, COLS, BLOCK = 200, 64, 32


def _rows(model, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path))
    return make_session(path).run(None, {"input_ids": np.arange(ROWS, dtype=np.int64)[None]})[0][0]


def test_the_split_lookup_is_exact(tmp_path):
    model, table = gather_graph(ROWS, COLS)
    split_table(model, model.graph.node[0], np.array([7, 3, 150, 0]))
    assert np.array_equal(_rows(model, tmp_path), table)  # every row, head and tail, bit for bit
    ((out, (_, _, perm)),) = split_tables(model.graph).items()
    assert out == "rows" and list(perm[[7, 3, 150, 0]]) == [0, 1, 2, 3]


def test_head_rows_take_eight_bits_and_tail_rows_four(tmp_path):
    model, table = gather_graph(ROWS, COLS)
    head = np.arange(0, ROWS, 5)
    rows = _rows(quantize_tables(model, BLOCK, aware=True, head=head), tmp_path)
    blocks = table.reshape(ROWS, COLS // BLOCK, BLOCK)
    span = (np.maximum(blocks.max(-1), 0) - np.minimum(blocks.min(-1), 0))[..., None]  # each block's range
    error = np.abs(rows - table).reshape(blocks.shape)
    is_head = np.isin(np.arange(ROWS), head)
    assert (error[is_head] <= 0.5 * span[is_head] / 255 * 1.01 + 1e-6).all()
    assert (error[~is_head] <= 0.5 * span[~is_head] / 15 * 1.01 + 1e-6).all()
    assert error[~is_head].mean() > 4 * error[is_head].mean()  # the head does keep more


def test_the_head_is_the_most_frequent_real_tokens():
    ids = np.array([[5, 5, 5, 9, 9, 2, 0, 0], [5, 9, 1, 1, 1, 1, 0, 0]])
    mask = np.array([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0, 0]])  # padding (0) never counts
    feeds = [{"input_ids": ids, "attention_mask": mask}]
    assert list(frequent_ids(feeds, 10, 3)) == [1, 5, 9]
    assert list(frequent_ids(feeds, 10, 100)) == [1, 5, 9, 2]  # only tokens seen
    assert len(frequent_ids(feeds, 3, 100)) == 2  # never the whole table


@pytest.mark.parametrize("head", [np.array([1, 1]), np.array([ROWS]), np.arange(ROWS)])
def test_bad_heads_are_refused(tmp_path, head):
    model, _ = gather_graph(ROWS, COLS)
    with pytest.raises(CompressorError, match="distinct ids"):
        split_table(model, model.graph.node[0], head)
    with pytest.raises(CompressorError, match="0 or more"):
        scheme_named("int4-aware")(table_head=-1)
    with pytest.raises(CompressorError, match="goes with --quantize .*int4-aware"):
        check_options(["int8", "int4"], {"table_head": 16})
    check_options(["int8", "int4-trained"], {"table_head": 16})  # run: one of its schemes takes it
