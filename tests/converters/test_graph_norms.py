"""The norms a trained scheme's student trains (converters/quantization/corrections/graph_norms.py): a Llama's RMS
norms, which the fused decoder computes in (Skip)SimplifiedLayerNormalization nodes, are held as GraphRMSNorm modules
that compute what the model's did, and what training makes of their scales goes back into those nodes."""

import numpy as np
import pytest
import torch

from converters.checkpoint import load_model
from converters.export import export_onnx, sample_inputs
from converters.quantization.corrections.graph_norms import GraphRMSNorm
from converters.quantization.corrections.training import trainer
from converters.quantization.quantize import quantize_onnx
from converters.quantization.registry import scheme_named
from eval.graph import make_session
from eval.probe import full_feed
from tests.conftest import write_tiny_lm
from tests.converters.test_tied_codes import PASSAGES
from texts.tokens import encode_passages, load_tokenizer


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny Llama the fused decoder takes, its RMS norms' scales made unlike each other (as a trained model's)."""
    path = write_tiny_lm(tmp_path_factory.mktemp("norms") / "llama", "llama", hidden=128)
    model, _ = load_model(path)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if type(m).__name__.endswith("RMSNorm"):
                m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=generator))
    return path, model, export_onnx(model, path.parent / "lm.onnx").path


def _logits(session, ids, mask):
    return session.run(["logits"], full_feed(session, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}))[0]


@pytest.mark.parametrize("changed", [False, True])
def test_the_rms_norms_are_held_and_written_back(llama, tmp_path, changed):
    path, model, fp32 = llama
    vocab = model.get_input_embeddings().num_embeddings
    ids = sample_inputs(vocab, 1, 9, 0)[0]
    mask = torch.ones_like(ids)
    seen = {}

    def fit(student):  # as a fine-tune would leave them: each scale changed
        norms = [m for m in student.modules() if isinstance(m, GraphRMSNorm)]
        seen["norms"] = len(norms)
        with torch.no_grad():
            seen["before"] = student(input_ids=ids, attention_mask=mask).logits.numpy()
            for k, norm in enumerate(norms):
                norm.weight.mul_(
                    1 + 0.3 * changed * torch.rand(norm.weight.shape, generator=torch.Generator().manual_seed(k))
                )
            seen["after"] = student(input_ids=ids, attention_mask=mask).logits.numpy()

    text = encode_passages(load_tokenizer(path), PASSAGES)
    config = scheme_named("int4-trained")(block_size=16, accuracy_level=0, correction_share=0.3)
    result = quantize_onnx(fp32, tmp_path / "t.onnx", config, text, vocab=vocab, train=trainer(model, fit))
    assert seen["norms"] == 2 * model.config.num_hidden_layers + 1  # two a layer and the last
    graph = _logits(make_session(result.path), ids, mask)
    scale = np.abs(graph).max()
    assert np.abs(seen["after"] - graph).max() <= 1e-2 * scale  # the graph's factors rounded to 8 bits after
    if changed:
        assert np.abs(seen["before"] - graph).max() >= 5 * np.abs(seen["after"] - graph).max()  # the new scales


def test_a_constant_moved_into_its_own_initializer_is_not_stored_twice():
    """SmolLM2's 61 RMS scales were stored twice (0.14 MB) before the old initializer went where no node read it."""
    from onnx import helper, numpy_helper

    from converters.quantization.corrections.graph_norms import own_initializers

    scale = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], [f"y{k}"]) for k in range(2)]
    graph = helper.make_graph(nodes, "g", [], [], [scale])
    assert own_initializers(graph, graph.node[0], {1: "first"})[0].tolist() == [0, 1, 2, 3]
    assert sorted(i.name for i in graph.initializer) == ["first", "w"]  # the second Mul still reads w
    own_initializers(graph, graph.node[1], {1: "second"})
    assert sorted(i.name for i in graph.initializer) == ["first", "second"]
