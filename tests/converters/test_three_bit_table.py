"""The word table in 3 bits: the lookup gathers exactly the rows `three_bit_rows` reads (what the training
holds), each within half a 3-bit step of the table (a head's within half a 4-bit step), in 3.375 bits a
weight; widths other than 4, 3, 2 and 1, a scheme that does not take them and an LM's tied table are refused."""

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from compressor.errors import CompressorError
from converters.quantization.registry import check_options, scheme_named
from converters.quantization.rounding.int4 import quantize_tables
from converters.quantization.rounding.three_bit_table import THREE_BIT_PARTS, three_bit_outputs, three_bit_rows
from eval.graph import make_session
from tests.conftest import gather_graph

ROWS, COLS, BLOCK = 200, 128, 64


def _run(model, tmp_path, ids):
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path))
    return make_session(path).run(None, {"input_ids": ids})[0]


def _half_steps(rows, table, levels):
    """Each weight's error in half steps of its block's range over `levels`."""
    blocks = table.reshape(ROWS, COLS // BLOCK, BLOCK)
    span = (np.maximum(blocks.max(-1), 0) - np.minimum(blocks.min(-1), 0))[..., None]
    return (np.abs(rows - table).reshape(blocks.shape) / (0.5 * span / levels)).reshape(ROWS, COLS)


def test_the_lookup_gathers_the_rows_the_training_holds(tmp_path):
    model, table = gather_graph(ROWS, COLS)
    model = quantize_tables(model, BLOCK, aware=True, bits=3)
    assert not [i for i in model.graph.initializer if i.name == "table"]  # no fp32 copy left
    ids = np.random.default_rng(1).integers(0, ROWS, size=(3, 9))
    rows = _run(model, tmp_path, ids)
    held = three_bit_rows(model.graph, "rows")
    assert three_bit_outputs(model.graph) == {"rows"}
    assert rows.shape == (3, 9, COLS) and np.array_equal(rows, held[ids])  # bit for bit
    steps = _half_steps(held, table, 7)
    assert steps.max() <= 1.01 and steps.mean() > 0.3  # 3-bit rounding: within half a step, and not finer
    stored = sum(numpy_helper.to_array(i).nbytes for i in model.graph.initializer if i.name.endswith(THREE_BIT_PARTS))
    assert stored == ROWS * COLS * 3 // 8 + ROWS * (COLS // BLOCK) * 3  # codes, fp16 scales, uint8 zero points


def test_a_head_in_four_bits_and_the_tail_in_three(tmp_path):
    model, table = gather_graph(ROWS, COLS)
    head = np.arange(0, ROWS, 5)
    model = quantize_tables(model, BLOCK, aware=True, head=head, bits=3)
    assert any(n.op_type == "GatherBlockQuantized" for n in model.graph.node)  # the head's 4 bits
    rows = _run(model, tmp_path, np.arange(ROWS, dtype=np.int64)[None])[0]
    is_head = np.isin(np.arange(ROWS), head)
    assert _half_steps(rows, table, 15)[is_head].max() <= 1.01
    tail = _half_steps(rows, table, 7)[~is_head]
    assert tail.max() <= 1.01 and tail.mean() > 0.3
    assert np.array_equal(rows[~is_head], three_bit_rows(model.graph, "rows_tail"))  # in token order


def test_bad_widths_are_refused():
    with pytest.raises(CompressorError, match="one of 4, 3"):
        scheme_named("int4-trained")(table_bits=5)
    with pytest.raises(CompressorError, match="goes with --quantize .*int4-aware"):
        check_options(["int8", "int4"], {"table_bits": 3})
    with pytest.raises(CompressorError, match="an LM's tied head"):
        scheme_named("int4-trained")(table_bits=3).check(SimpleNamespace(factor_form="int4"))
    check_options(["int8", "int4-trained"], {"table_bits": 3})  # run: one scheme takes it
    scheme_named("int4-trained")(table_bits=3).check(SimpleNamespace(factor_form="int8"))
    scheme_named("int4-aware")().check(SimpleNamespace(factor_form="int4"))
