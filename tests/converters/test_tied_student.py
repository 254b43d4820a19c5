"""A tied LM's student for int4-trained (converters/quantization/corrections/tied_student.py): its table is the one
the graph's lookup and logits read (the tied head's codes), and the head's corrections, whole or split by frequency,
add to its logits as they do in the graph, and go back into it trained."""

import copy

import numpy as np
import onnx
import pytest
import torch

from converters.checkpoint import load_model
from converters.export import export_onnx, sample_inputs
from converters.quantization.corrections.correction import add_corrections, corrected_layers, input_grams
from converters.quantization.corrections.tied_student import HeadCorrection
from converters.quantization.corrections.training import student_of, write_back
from converters.quantization.rounding.int4 import name_nodes, quantize_4bit
from converters.quantization.rounding.products import products_as_matmul
from converters.quantization.rounding.smoothing import activation_absmax, smooth
from converters.quantization.rounding.tied_head import split_tied_head
from converters.quantization.storage.tied_codes import share_tied_codes, tied_smoothing
from eval.graph import make_session
from eval.probe import full_feed

HEAD = np.array([9, 2, 5, 11, 3, 7, 0, 14])  # token ids, most frequent first


def _logits_of(path, ids, mask) -> np.ndarray:
    session = make_session(path)
    return session.run(["logits"], full_feed(session, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}))[0]


@pytest.mark.parametrize("split", [False, True])
def test_the_student_of_a_tied_lm_computes_what_its_graph_computes(tiny_gpt2_dir, tmp_path, split):
    model, _ = load_model(tiny_gpt2_dir)
    vocab = model.get_input_embeddings().num_embeddings
    exported = products_as_matmul(onnx.load(str(export_onnx(model, tmp_path / "lm.onnx").path)))
    ids = sample_inputs(vocab, 1, 9, 0)[0]
    mask = torch.ones_like(ids)  # no padding: a GPT-2's logits there are not comparable
    feeds = [full_feed(make_session(tmp_path / "lm.onnx"), {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})]
    smoothed = smooth(exported, activation_absmax(exported, feeds), 0.5)
    tied_head = split_tied_head(smoothed, HEAD) if split else ()
    name_nodes(smoothed.graph)
    tied = tied_smoothing(smoothed.graph)
    quantized = quantize_4bit(smoothed, 16, 0, aware=True, eight_bit=tied_head)
    logits = [n.output[0] for n in quantized.graph.node if n.op_type == "MatMulNBits" and "logits" in n.output[0]]
    assert len(logits) == (2 if split else 1)
    corrected = add_corrections(
        copy.deepcopy(quantized), smoothed, input_grams(smoothed, feeds), dict.fromkeys(logits, 4)
    )
    assert sorted(corrected_layers(corrected)) == sorted(logits)  # the tied head corrected, whole or both halves
    student, links = student_of(copy.deepcopy(model), exported, smoothed, corrected)
    onnx.save_model(share_tied_codes(copy.deepcopy(corrected), tied), str(tmp_path / "q.onnx"))
    graph = _logits_of(tmp_path / "q.onnx", ids, mask)
    with torch.no_grad():
        ours, dense = (m(input_ids=ids, attention_mask=mask).logits.numpy() for m in (student, model))
    scale = np.abs(graph).max()
    assert np.abs(ours - graph).max() <= 1e-3 * scale  # the head's codes in both reads, its corrections added
    assert np.abs(dense - graph).max() >= 1e-2 * scale  # and not the unrounded model's
    onnx.save_model(share_tied_codes(copy.deepcopy(quantized), tied), str(tmp_path / "plain.onnx"))
    uncorrected = _logits_of(tmp_path / "plain.onnx", ids, mask)
    assert np.abs(ours - uncorrected).max() >= 10 * np.abs(ours - graph).max()  # the corrections are in the student
    heads = [m for m in student.modules() if isinstance(m, HeadCorrection)]
    assert len(heads) == len(logits) and sorted(links.heads) == sorted(logits)
    assert all(p.requires_grad for m in heads for p in (m.left, m.right))  # trained with the layers' corrections
    with torch.no_grad():  # as a fine-tune would leave them: the trained factors go back into the graph
        for k, m in enumerate(heads):
            m.right.mul_(1.5).add_(0.05 * torch.randn(m.right.shape, generator=torch.Generator().manual_seed(k)))
        trained = student(input_ids=ids, attention_mask=mask).logits.numpy()
    written = write_back(copy.deepcopy(corrected), student, links)
    onnx.save_model(share_tied_codes(written, tied), str(tmp_path / "t.onnx"))
    after = _logits_of(tmp_path / "t.onnx", ids, mask)
    assert np.abs(trained - after).max() <= 1e-3 * scale
    assert np.abs(trained - graph).max() >= 10 * np.abs(trained - after).max()  # the change is the factors'
