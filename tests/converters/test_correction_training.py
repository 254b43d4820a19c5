"""Train through the rounding (int4-trained): the PyTorch student holds the weights the quantized graph
holds, in 4 bits and in 8 (its output equals the graph's), the trained factors go back into the graph exactly, a few
fine-tune steps raise the agreement with the fp32 model, and the scheme runs end to end."""

import copy

import numpy as np
import onnx
import pytest
import torch

from compressor.corrected_linear import CorrectedLinear
from compressor.errors import CompressorError
from converters.checkpoint import load_model
from converters.compress import compress_
from converters.export import export_onnx, sample_inputs
from converters.finetune import Distillation, finetune_
from converters.finetune.config import FinetuneConfig
from converters.methods.lowrank import LowRankConfig
from converters.plan import Plan
from converters.quantization.corrections.correction import (
    add_corrections,
    bias_before_correction,
    corrected_layers,
    input_grams,
)
from converters.quantization.corrections.correction_plan import plan_corrections
from converters.quantization.corrections.graph_norms import GraphLayerNorm
from converters.quantization.corrections.training import student_of, trainer, write_back
from converters.quantization.quantize import quantize_onnx
from converters.quantization.registry import scheme_named
from converters.quantization.rounding.int4 import four_bit_codes, name_nodes, quantize_4bit
from converters.quantization.rounding.smoothing import activation_absmax, smooth
from converters.quantization.rounding.three_bit_table import three_bit_outputs
from converters.quantization.storage.codebook_table import codebook_outputs
from eval.graph import make_session
from tests.conftest import WORDS, write_tiny_bert
from texts.tokens import load_tokenizer

NAMES = ("input_ids", "attention_mask")


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A tiny BERT wide enough for rank-16 corrections, its fp32 graph, and calibration batches."""
    path = write_tiny_bert(tmp_path_factory.mktemp("wide") / "bert", hidden=128, intermediate=256)
    model, _ = load_model(path)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # LayerNorms as training leaves them: each its own values (untrained ones are all equal)
        for norm in [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]:
            norm.weight.add_(0.1 * torch.randn(norm.weight.shape, generator=generator))
            norm.bias.add_(0.1 * torch.randn(norm.bias.shape, generator=generator))
    fp32 = export_onnx(model, path.parent / "m.onnx").path
    vocab = model.get_input_embeddings().num_embeddings
    feeds = [dict(zip(NAMES, (x.numpy() for x in sample_inputs(vocab, 8, 12, seed)))) for seed in range(4)]
    return path, model, fp32, feeds


def _corrected(fp32, feeds, table_bits=4):
    """(exported, smoothed, corrected with fp32 factors), MatMulNBits in fp32 compute (accuracy level 0)
    so that PyTorch and ONNX Runtime multiply the same numbers; the word table split, some rows in 8 bits (or,
    `table_bits` 3 or 2, in 4 and the rest in 3 or codebook codes)."""
    exported = onnx.load(str(fp32))
    smoothed = smooth(exported, activation_absmax(exported, feeds), 0.5)
    name_nodes(smoothed.graph)
    eight = (next(n.name for n in smoothed.graph.node if n.op_type == "MatMul"),)  # as the budget may choose
    head = np.arange(1, 60, 3)
    quantized = quantize_4bit(smoothed, 16, 0, aware=True, eight_bit=eight, head=head, table_bits=table_bits)
    losses = {n.output[0]: 1.0 for n in smoothed.graph.node if n.op_type == "MatMul"}
    grams = input_grams(smoothed, feeds)
    ranks, *_ = plan_corrections(quantized, smoothed, grams, losses, int(0.3 * four_bit_codes(smoothed)))
    return exported, smoothed, add_corrections(quantized, smoothed, grams, ranks)


def _run(proto, tmp_path, feed):
    path = tmp_path / "g.onnx"
    onnx.save_model(proto, str(path))
    return make_session(path).run(None, feed)[0]


def _torch(model, feed):
    with torch.no_grad():
        ids, mask = (torch.from_numpy(feed[n]) for n in NAMES)
        return model(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()


@pytest.mark.parametrize("inputs", [64, 70])  # a whole number of blocks, and a last block cut short
def test_a_corrected_layers_weight_made_again_in_the_backward_gives_autograds_gradients(inputs):
    """The weight Q ⊙ G is not kept for the backward but made again: the output and every gradient (x, the gains, the
    correction, the bias) as autograd's through the weight made and kept."""
    torch.manual_seed(0)
    layer = CorrectedLinear(torch.randn(33, inputs), torch.randn(inputs, 4), torch.randn(4, 33), torch.randn(33), 32)
    with torch.no_grad():
        layer.gain.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, inputs, requires_grad=True)
    params = [x, *layer.parameters()]
    got = torch.autograd.grad(layer(x).square().sum(), params)
    kept = torch.nn.functional.linear(x, layer.scaled(), layer.bias) + (x @ layer.left) @ layer.right
    torch.testing.assert_close(layer(x), kept, rtol=1e-5, atol=1e-4)
    for g, expected in zip(got, torch.autograd.grad(kept.square().sum(), params)):
        torch.testing.assert_close(g, expected, rtol=1e-4, atol=1e-3)


def test_a_corrected_layer_trains_under_bf16_autocast_as_a_gpus_fine_tune_runs_it():
    """bf16 inputs and gradients against a float32 weight and gains: the backward runs, each gradient in its tensor's
    dtype and near the float32 one."""
    torch.manual_seed(0)
    layer = CorrectedLinear(torch.randn(33, 70), torch.randn(70, 4), torch.randn(4, 33), torch.randn(33), 32)
    x = torch.randn(2, 5, 70, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (half,) = torch.autograd.grad(layer(x).float().square().sum(), layer.gain)
    (full,) = torch.autograd.grad(layer(x).square().sum(), layer.gain)
    assert half.dtype == torch.float32 and torch.isfinite(half).all()
    assert float((half - full).norm() / full.norm()) < 0.05


@pytest.mark.parametrize("table_bits", [4, 3, 2])
def test_the_student_computes_what_the_rounded_graph_computes(wide, tmp_path, table_bits):
    _, model, fp32, feeds = wide
    exported, smoothed, corrected = _corrected(fp32, feeds, table_bits)
    assert bool(three_bit_outputs(corrected.graph)) == (table_bits == 3)  # the tail's 3-bit lookup
    assert bool(codebook_outputs(corrected.graph)) == (table_bits == 2)  # or its codebook lookup
    student, links = student_of(copy.deepcopy(model), exported, smoothed, corrected)
    assert links.layers and all(
        isinstance(student.get_submodule(n), CorrectedLinear) for n, _, _ in links.layers.values()
    )
    assert len(links.norms) == 5  # the embeddings' LayerNorm and two in each of the two layers
    graph, ours, dense = _run(corrected, tmp_path, feeds[0]), _torch(student, feeds[0]), _torch(model, feeds[0])
    scale = np.abs(graph).max()
    assert np.abs(ours - graph).max() <= 1e-4 * scale  # the same rounded weights, tables and corrections
    assert np.abs(dense - graph).max() >= 1e-2 * scale  # and not the unrounded model's


def test_the_bias_goes_before_the_correction_and_the_sum_stays(wide, tmp_path):
    # (Q x + b) + (x L) R: ONNX Runtime folds b into MatMulNBits, one Add is left a correction
    _, _, fp32, feeds = wide
    _, _, corrected = _corrected(fp32, feeds)
    layers = corrected_layers(corrected)
    moved = bias_before_correction(copy.deepcopy(corrected))
    assert sorted(corrected_layers(moved)) == sorted(layers)
    producers = {o: n for n in moved.graph.node for o in n.output}
    constants = {i.name for i in moved.graph.initializer}
    constants |= {n.output[0] for n in moved.graph.node if n.op_type == "Identity" and n.input[0] in constants}
    for out in layers:
        added = producers[f"{out}_biased"]  # the bias Add, fed by MatMulNBits' output and a constant
        assert added.op_type == "Add" and f"{out}_rounded" in added.input and set(added.input) & constants
        assert next(n for n in moved.graph.node if n.name == f"{out}_corrected").input[0] == f"{out}_biased"
    before, after = _run(corrected, tmp_path, feeds[0]), _run(moved, tmp_path, feeds[0])
    assert np.abs(after - before).max() <= 1e-5 * np.abs(before).max()  # the same sum, in another order


def test_a_compressed_models_factors_are_held_rounded_and_their_corrections_frozen(wide, tmp_path):
    # a low-rank table and low-rank FFN layers: their factors are parameters of compact modules, no nn.Linear
    path, _, _, feeds = wide
    model, _ = load_model(path)
    plain = {"fit": "plain"}
    ffn = LowRankConfig(rank=64, keep=None, **plain)  # factors wide enough for a rank-16 correction
    plan = Plan((("embeddings", LowRankConfig(keep=0.5, **plain)), ("intermediate.dense", ffn)))
    compress_(model, plan, progress=False)
    fp32 = export_onnx(model, tmp_path / "c.onnx").path
    exported, smoothed, corrected = _corrected(fp32, feeds)
    factor_outs = {n.output[0] for n in exported.graph.node if n.op_type == "MatMul" and "intermediate" in n.name}
    student, links = student_of(copy.deepcopy(model), exported, smoothed, corrected)
    assert links.layers and not set(links.layers) & factor_outs  # trained corrections: nn.Linear layers only
    assert set(corrected_layers(corrected)) & factor_outs  # while some factor is corrected, frozen
    before = dict(model.named_parameters())
    for name, param in student.named_parameters():
        if name.endswith(("codes", "basis", "up", "down")):
            assert not torch.equal(param, before[name]), name  # each factor as the graph rounds it
    graph, ours = _run(corrected, tmp_path, feeds[0]), _torch(student, feeds[0])
    assert np.abs(ours - graph).max() <= 1e-4 * np.abs(graph).max()


def test_trained_factors_biases_and_layer_norms_go_back_into_the_graph(wide, tmp_path):
    _, model, fp32, feeds = wide
    exported, smoothed, corrected = _corrected(fp32, feeds)
    student, links = student_of(copy.deepcopy(model), exported, smoothed, corrected)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        layers = [student.get_submodule(name) for name, _, _ in links.layers.values()]
        norms = [student.get_submodule(name) for name in links.norms]
        for p in [p for m in layers + norms for p in m.parameters()]:
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    assert all(m.gain is not None for m in layers)  # block scales' gains, perturbed with the rest
    graph = _run(write_back(corrected, student, links), tmp_path, feeds[1])
    assert np.abs(_torch(student, feeds[1]) - graph).max() <= 1e-4 * np.abs(graph).max()


def test_a_few_steps_through_the_rounding_raise_the_agreement(wide):
    path, model, fp32, feeds = wide
    exported, smoothed, corrected = _corrected(fp32, feeds)
    student, _ = student_of(copy.deepcopy(model), exported, smoothed, corrected)
    texts = [" ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 12)) for i in range(1, 60)]
    cfg = FinetuneConfig(steps=30, seconds=None, linear_lr=1e-3, eval_every=10, batch_size=8, warmup_steps=2)
    trained = (CorrectedLinear, GraphLayerNorm)
    report = finetune_(Distillation(student, model, load_tokenizer(path), texts[:48], texts[48:], trained), cfg)
    corrections = [p for m in student.modules() if isinstance(m, trained) for p in m.parameters()]
    assert report.trainable_params == sum(p.numel() for p in corrections)  # factors, their biases, LayerNorms
    assert report.best_val_cosine > report.start_val_cosine


def test_int4_trained_end_to_end_and_its_refusals(wide, tmp_path):
    _, model, fp32, feeds = wide
    vocab = model.get_input_embeddings().num_embeddings
    seen = []
    result = quantize_onnx(
        fp32,
        tmp_path / "t.onnx",
        scheme_named("int4-trained")(block_size=16, correction_share=0.3),
        feeds,
        vocab=vocab,
        train=trainer(model, seen.append),
    )
    assert len(seen) == 1 and any(isinstance(m, CorrectedLinear) for m in seen[0].modules())
    assert 0 < result.parity_rel <= scheme_named("int4").gate and result.corrections
    with pytest.raises(CompressorError, match="goes with int4-trained"):
        quantize_onnx(
            fp32,
            tmp_path / "x.onnx",
            scheme_named("int4-corrected")(),
            feeds,
            vocab=vocab,
            train=trainer(model, seen.append),
        )
    with pytest.raises(CompressorError, match="goes with int4-trained"):
        quantize_onnx(fp32, tmp_path / "x.onnx", scheme_named("int4-trained")(), feeds, vocab=vocab)
    assert not (tmp_path / "x.onnx").exists()


def test_a_grid_layers_student_holds_its_rounding_with_the_offsets_the_graph_adds(tmp_path):
    from tests.converters.test_grid import BLOCK, q4_1

    model, _ = load_model(write_tiny_bert(tmp_path / "bert", hidden=128, intermediate=256))
    with torch.no_grad():  # every linear layer on a Q4_1 grid, as SmolLM2's: the budget buys their offsets
        for linear in [m for m in model.modules() if isinstance(m, torch.nn.Linear)]:
            n, k = linear.weight.shape
            linear.weight.copy_(torch.from_numpy(q4_1(k, n).T.copy()))
    fp32 = export_onnx(model, tmp_path / "m.onnx").path
    vocab = model.get_input_embeddings().num_embeddings
    feeds = [dict(zip(NAMES, (x.numpy() for x in sample_inputs(vocab, 8, 12, seed)))) for seed in range(4)]
    seen = []
    config = scheme_named("int4-trained")(block_size=BLOCK, accuracy_level=0, correction_share=0.2)
    train = trainer(model, lambda student: seen.append(_torch(student, feeds[0])))
    result = quantize_onnx(fp32, tmp_path / "t.onnx", config, feeds, vocab=vocab, train=train)
    assert sum("offsets" in c for c in result.corrections.values()) >= 3
    graph, plain = make_session(result.path).run(None, feeds[0])[0], make_session(fp32).run(None, feeds[0])[0]
    scale = np.abs(graph).max()
    assert np.abs(seen[0] - graph).max() <= 2e-3 * scale  # Q + B O, as the graph adds the offsets after training
    assert np.abs(plain - graph).max() >= 2e-3 * scale  # and the graph is still rounded (its table, its scales)


def test_a_student_with_nothing_to_train_is_left_as_fitted_and_said_so(tiny_llama_dir, eval_text_file, capsys):
    from converters.kinds import kind_of
    from converters.pipeline.steps import correction_fit

    model, _ = load_model(tiny_llama_dir)
    config = scheme_named("int4-trained")(correction_time=5.0)
    fit_for = correction_fit([config], eval_text_file, kind_of(model), tiny_llama_dir)
    student = copy.deepcopy(model)  # no CorrectedLinear, no LayerNorm: SmolLM2's, its layers all offset
    before = {name: value.clone() for name, value in student.state_dict().items()}
    fit_for(model, config, "lm-int4-trained")(student)
    assert all(torch.equal(before[name], value) for name, value in student.state_dict().items())
    assert "lm-int4-trained: nothing to train" in capsys.readouterr().err
