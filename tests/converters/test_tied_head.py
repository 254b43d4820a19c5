"""A tied LM's table by frequency (converters/quantization/rounding/tied_head.py): the split is exact in fp32, and in
the 4-bit schemes the head's rows take 8 bits in the lookup and the logits alike, each half's codes stored once."""

import numpy as np
import onnx
import pytest

from converters.checkpoint import load_model
from converters.export import export_onnx, sample_inputs
from converters.quantization.quantize import quantize_onnx
from converters.quantization.registry import scheme_named
from converters.quantization.rounding.products import products_as_matmul
from converters.quantization.rounding.table_head import frequent_ids
from converters.quantization.rounding.tied_head import split_tied_head
from converters.quantization.storage.tied_codes import tied_pairs
from eval.graph import make_session
from eval.probe import full_feed
from tests.converters.test_tied_codes import PASSAGES, _rows
from texts.tokens import encode_passages, load_tokenizer

HEAD = np.array([9, 2, 5, 11, 3, 7, 0, 14])  # token ids, in the order a frequency count would give them


def _logits(path, vocab: int) -> np.ndarray:
    ids, mask = sample_inputs(vocab, 2, 7, 0)
    session = make_session(path)
    return session.run(["logits"], full_feed(session, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}))[0]


def test_the_split_tied_head_is_exact(tiny_llama_dir, tmp_path):
    model, _ = load_model(tiny_llama_dir)
    vocab = model.get_input_embeddings().num_embeddings
    fp32 = export_onnx(model, tmp_path / "lm.onnx").path
    proto = products_as_matmul(onnx.load(str(fp32)))
    (table,) = tied_pairs(proto.graph)
    gather, matmul = split_tied_head(proto, HEAD)
    assert len(tied_pairs(proto.graph)) == 2 and table not in tied_pairs(proto.graph)  # two halves, each a pair
    assert {n.name for n in proto.graph.node} >= {gather, matmul}
    onnx.save_model(proto, str(tmp_path / "split.onnx"))
    split, whole = _logits(tmp_path / "split.onnx", vocab), _logits(fp32, vocab)
    assert np.abs(split - whole).max() <= 1e-5 * np.abs(whole).max()  # every token's logit, in token order


@pytest.mark.parametrize("scheme", ["int4-aware", "int4-corrected"])
def test_the_heads_rows_take_eight_bits_in_both_reads(tiny_llama_dir, tmp_path, scheme):
    model, _ = load_model(tiny_llama_dir)
    table = model.get_input_embeddings().weight.detach().numpy()
    vocab = table.shape[0]
    fp32 = export_onnx(model, tmp_path / "lm.onnx").path
    text = encode_passages(load_tokenizer(tiny_llama_dir), PASSAGES)
    result = quantize_onnx(
        fp32, tmp_path / "q.onnx", scheme_named(scheme)(block_size=16, table_head=8), text, vocab=vocab
    )
    assert result.parity_rel <= scheme_named("int4").gate
    graph = onnx.load(str(result.path)).graph
    bits = {
        n.input[1]: next(a.i for a in n.attribute if a.name == "bits") for n in graph.node if n.op_type == "MatMulNBits"
    }
    gathers = {n.name: n for n in graph.node if n.op_type == "GatherBlockQuantized"}
    head, tail = (next(n for name, n in gathers.items() if f"_{part}_table" in name) for part in ("head", "tail"))
    assert head.input[0] in bits and tail.input[0] in bits  # each half's codes once: its logits' MatMulNBits'
    assert bits[head.input[0]] == 8 and bits[tail.input[0]] in (4, 8)  # int4-aware may buy the tail 8 bits too
    lookup = next(
        n.output[0] for n in onnx.load(str(fp32)).graph.node if n.op_type == "Gather" and "input_ids" in n.input
    )
    frequent = frequent_ids(text, vocab, 8)  # the head quantize_onnx chose
    rare = np.setdiff1d(np.arange(vocab), frequent)[:8]
    errors = []
    for ids in (frequent, rare):
        rows = _rows(result.path, lookup, ids[None]).reshape(len(ids), -1)
        errors.append(np.linalg.norm(rows - table[ids]) / np.linalg.norm(table[ids]))
    assert errors[0] < 0.02  # 8 bits
    if bits[tail.input[0]] == 4:
        assert errors[0] < errors[1] / 4  # the tail's 4 bits
