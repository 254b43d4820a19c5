"""The tying converter on tiny GPT-2 and Llama LMs trained untied, and three-way tying on a tiny
Marian encoder–decoder: one tensor at both ends (in memory, in the checkpoint and as one ONNX
initializer), the three starts, normalised heads exported with parity, dense and compressed, and
every bad input refused in one sentence before anything changes."""

import onnx
import pytest
import torch
from torch import nn
from transformers import MarianConfig, MarianMTModel

from compressor.errors import CompressorError
from compressor.lowrank_embedding import LowRankEmbedding
from compressor.tied_logits import TiedLogits
from compressor.tying import SCORES
from converters.checkpoint import load_model, save_compressed
from converters.compress import CompressionReport, compress_
from converters.export import export_onnx
from converters.kinds.causal_lm import CAUSAL_LM
from converters.methods.lowrank import LowRankConfig
from converters.plan import Plan
from converters.tying import TieConfig, set_score_, tie_, tie_encoder_decoder_
from tests.conftest import write_tiny_lm

IDS = torch.tensor([[5, 9, 2, 17, 3, 40, 8, 1]])


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def untied_dir(request, tmp_path_factory):
    return write_tiny_lm(tmp_path_factory.mktemp("untied") / request.param, request.param, tied=False, seed=1)


def logits(model, ids=IDS):
    with torch.no_grad():
        return CAUSAL_LM.output(model, ids, torch.ones_like(ids))


def table_params(model) -> int:
    tables = {id(p): p for p in model.parameters() if p.shape[0] == model.config.vocab_size}
    return sum(p.numel() for p in tables.values())


@pytest.mark.parametrize("init", ["output", "input", "mean"])
def test_tying_halves_the_tables_with_one_tensor_at_both_ends_started_from_init(untied_dir, init):
    model, _ = load_model(untied_dir)
    table, head = model.get_input_embeddings().weight.clone(), model.get_output_embeddings().weight.clone()
    before = table_params(model)
    tie_(model, TieConfig(init))
    assert table_params(model) * 2 == before
    assert isinstance(model.get_output_embeddings(), TiedLogits)
    assert model.get_output_embeddings().embedding.weight is model.get_input_embeddings().weight
    expected = {"output": head, "input": table, "mean": (table + head) / 2}[init]
    torch.testing.assert_close(model.get_input_embeddings().weight, expected, rtol=1e-4, atol=1e-5)
    h = torch.randn(3, expected.shape[1])
    torch.testing.assert_close(model.get_output_embeddings()(h), h @ expected.T, rtol=1e-4, atol=1e-5)


def test_a_tied_checkpoint_and_its_onnx_hold_one_table(untied_dir, tmp_path):
    model, source = load_model(untied_dir)
    plan = Plan((), tie=TieConfig("output", "cosine"))
    compress_(model, plan)
    save_compressed(model, plan, CompressionReport(), source, tmp_path / "tied")
    again, _ = load_model(tmp_path / "tied")
    assert again.get_output_embeddings().score == "cosine"
    torch.testing.assert_close(logits(again), logits(model), rtol=1e-4, atol=1e-5)
    result = export_onnx(again, tmp_path / "tied.onnx")
    vocab, dim = again.get_input_embeddings().weight.shape
    tables = [i for i in onnx.load(result.path).graph.initializer if tuple(i.dims) in ((vocab, dim), (dim, vocab))]
    assert len(tables) == 1


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("compressed", [False, True], ids=["dense", "lowrank"])
def test_every_score_exports_with_parity_dense_and_compressed(tiny_gpt2_dir, tmp_path, score, compressed):
    model, _ = load_model(tiny_gpt2_dir)  # tied already: the plan sets the score only
    entries = (("embeddings", LowRankConfig(rank=8, fit="plain")),) if compressed else ()
    compress_(model, Plan(entries, tie=TieConfig(None, score)))
    head = model.get_output_embeddings()
    assert head.score == score and isinstance(head.embedding, LowRankEmbedding) == compressed
    result = export_onnx(model, tmp_path / f"{score}.onnx")
    assert result.parity_max_abs < 1e-4


def test_l2_normalises_the_models_input_lookup(tiny_gpt2_dir):
    model, _ = load_model(tiny_gpt2_dir)
    set_score_(model, "l2")
    table = model.get_input_embeddings()
    unit = table.weight / table.weight.norm(dim=1, keepdim=True)
    torch.testing.assert_close(table(IDS), unit[IDS], rtol=1e-4, atol=1e-5)
    set_score_(model, "dot")  # the hook goes with the head it belonged to
    torch.testing.assert_close(table(IDS), table.weight[IDS], rtol=1e-4, atol=1e-5)


def test_tie_then_compress_the_tied_table_in_one_plan(untied_dir, tmp_path):
    model, _ = load_model(untied_dir)
    compress_(model, Plan((("embeddings", LowRankConfig(rank=8, fit="plain")),), tie=TieConfig("output")))
    head = model.get_output_embeddings()
    assert isinstance(head, TiedLogits) and head.embedding is model.get_input_embeddings()
    assert isinstance(head.embedding, LowRankEmbedding)
    assert export_onnx(model, tmp_path / "m.onnx").parity_max_abs < 1e-4


def test_bad_input_is_one_sentence_and_changes_nothing(untied_dir, tiny_bert_dir, tiny_gpt2_dir):
    encoder, _ = load_model(tiny_bert_dir)
    with pytest.raises(CompressorError, match="no output projection to tie"):
        tie_(encoder, TieConfig())
    model, _ = load_model(untied_dir)
    before = logits(model)
    with pytest.raises(CompressorError, match="is not tied"):
        set_score_(model, "cosine")
    with pytest.raises(CompressorError, match="is not tied"):
        compress_(model, Plan((), tie=TieConfig(None, "cosine")))
    vocab, dim = model.get_input_embeddings().weight.shape
    model.set_output_embeddings(nn.Linear(dim, vocab + 3, bias=False))
    with pytest.raises(CompressorError, match=rf"input table {vocab} × {dim}, output projection {vocab + 3} × {dim}"):
        tie_(model, TieConfig())
    with pytest.raises(CompressorError, match="unknown tying init"):
        TieConfig("sum")
    model, _ = load_model(untied_dir)
    with pytest.raises(CompressorError, match="tie first, then compress"):
        compress_(model, Plan((("embeddings", LowRankConfig(rank=8, fit="plain")),)))
        tie_(model, TieConfig())
    torch.testing.assert_close(logits(load_model(untied_dir)[0]), before, rtol=1e-4, atol=1e-5)


def tiny_marian(source: int, target: int) -> MarianMTModel:
    config = MarianConfig(
        vocab_size=source,
        decoder_vocab_size=target,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
        share_encoder_decoder_embeddings=False,
        tie_word_embeddings=False,
        pad_token_id=0,
        decoder_start_token_id=0,
    )
    return MarianMTModel(config).eval()


def test_three_way_tying_leaves_one_matrix_in_an_encoder_decoder():
    model = tiny_marian(50, 50)
    head = model.get_output_embeddings().weight.detach().clone()
    before = sum(p.numel() for p in model.parameters())
    tie_encoder_decoder_(model, "output")
    ends = [model.get_encoder().get_input_embeddings(), model.get_decoder().get_input_embeddings()]
    ends.append(model.get_output_embeddings())
    assert len({m.weight.data_ptr() for m in ends}) == 1
    assert sum(p.numel() for p in model.parameters()) == before - 2 * 50 * 16
    torch.testing.assert_close(ends[0].weight, head, rtol=1e-4, atol=1e-5)
    out = model(input_ids=IDS % 50, decoder_input_ids=IDS % 50).logits
    assert out.shape == (1, 8, 50) and bool(torch.isfinite(out).all())


def test_three_way_tying_refuses_two_vocabularies_and_a_decoder_only_model(tiny_gpt2_dir):
    model = tiny_marian(50, 60)
    with pytest.raises(CompressorError, match="one vocabulary for source and target.*50.*60"):
        tie_encoder_decoder_(model)
    assert len({p.data_ptr() for p in model.parameters()}) == len(list(model.parameters()))
    with pytest.raises(CompressorError, match="needs an encoder–decoder"):
        tie_encoder_decoder_(load_model(tiny_gpt2_dir)[0])
