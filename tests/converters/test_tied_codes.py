"""A tied LM's 4-bit graph stores its table's codes once: the token rows are gathered from the head's
MatMulNBits codes (converters.quantization.storage.tied_codes), equal to the head's weight read back (divided
by SmoothQuant's s), within the 4-bit rounding of the original table, and the file is smaller."""

import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from converters.checkpoint import load_model
from converters.export import export_onnx, sample_inputs
from converters.nbits_storage import dequantize_nbits
from converters.quantization.quantize import quantize_onnx
from converters.quantization.registry import scheme_named
from eval.probe import full_feed
from texts.tokens import encode_passages, load_tokenizer

PASSAGES = ["the cat sat on the mat and looked at the dog", "numbers 1 2 3 and words", "a b c d e f"] * 4


def _rows(path, name: str, ids: np.ndarray) -> np.ndarray:
    """The value `name` (the table lookup's output) of the graph at `path` for the token ids `ids`."""
    proto = onnx.load(str(path))
    proto.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    return session.run([name], full_feed(session, feed))[0]


@pytest.mark.parametrize("scheme", ["int4", "int4-aware", "int4-corrected"])
def test_the_table_is_read_from_the_head_codes(tiny_llama_dir, tmp_path, monkeypatch, scheme):
    model, _ = load_model(tiny_llama_dir)
    table = model.get_input_embeddings().weight.detach().numpy()
    vocab, dim = table.shape
    fp32 = export_onnx(model, tmp_path / "lm.onnx").path
    text = encode_passages(load_tokenizer(tiny_llama_dir), PASSAGES)
    shared = quantize_onnx(fp32, tmp_path / "shared.onnx", scheme_named(scheme)(), text, vocab=vocab)
    assert shared.parity_rel <= scheme_named("int4").gate
    graph = onnx.load(str(shared.path)).graph
    gathered = {n.input[0] for n in graph.node if n.op_type == "GatherBlockQuantized"}
    multiplied = {n.input[1] for n in graph.node if n.op_type == "MatMulNBits"}
    assert len(gathered) == 1 and gathered <= multiplied  # the table's codes, once: the head's

    lookup = next(
        n.output[0] for n in onnx.load(str(fp32)).graph.node if n.op_type == "Gather" and "input_ids" in n.input
    )
    ids = np.array([[1, 5, 7, vocab - 1]], dtype=np.int64)
    rows = _rows(shared.path, lookup, ids).reshape(-1, dim)
    head = next(n for n in graph.node if n.op_type == "MatMulNBits" and "_transposed" in n.input[1])
    read_back = dequantize_nbits(graph, head).T[ids[0]]  # (ids, D): the head's weight rows, smoothed
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    unsmooth = next((v for k, v in inits.items() if k.endswith("_shared_unsmooth")), np.ones(dim))
    smoothed = not np.allclose(unsmooth, 1.0, rtol=0, atol=1e-3)  # SmoothQuant's s is far from 1, not 1e-7 off
    assert (scheme != "int4") == smoothed  # the data-aware schemes smooth the head
    np.testing.assert_allclose(rows, read_back * unsmooth, rtol=1e-5, atol=1e-6)
    error = np.linalg.norm(rows - table[ids[0]]) / np.linalg.norm(table[ids[0]])
    assert error < 0.15  # 4-bit rounding of the original rows, not some other table

    monkeypatch.setattr(sys.modules[scheme_named(scheme).__module__], "share_tied_codes", lambda proto, tied: proto)
    apart = quantize_onnx(fp32, tmp_path / "apart.onnx", scheme_named(scheme)(), text, vocab=vocab)
    stored = [sum(i.ByteSize() for i in onnx.load(str(r.path)).graph.initializer) for r in (apart, shared)]
    assert stored[0] > stored[1]  # the table's codes, scales and zero points, stored once (nodes aside: tiny here)
    ids, mask = sample_inputs(vocab, 2, 5, 0)
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (shared.path, apart.path)]
    logits = [s.run(["logits"], full_feed(s, feed))[0] for s in sessions]
    assert np.abs(logits[0] - logits[1]).max() < 0.2 * np.abs(logits[1]).max()  # two roundings of the same table
