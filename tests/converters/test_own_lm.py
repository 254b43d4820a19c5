"""A user's own language model, tools/lstm_lm.py's LSTM LM, which the toolkit has never seen:
wrapped in OwnLM by module name it is a causal LM to every step — tying, compression by module name,
the KL fine-tune and ONNX export with parity — and it round-trips through its own save and load."""

import pytest
import torch

from compressor.errors import CompressorError, PlanError
from compressor.lowrank_embedding import LowRankEmbedding
from compressor.tied_logits import TiedLogits
from converters.checkpoint import save_compressed
from converters.compress import CompressionReport, compress_
from converters.export import export_onnx
from converters.finetune import Distillation, finetune_
from converters.finetune.config import FinetuneConfig
from converters.kinds import OwnLM, kind_of
from converters.methods.lowrank import LowRankConfig
from converters.plan import Plan, match_plan
from converters.registry import compact_modules
from converters.tying import TieConfig, tie_
from texts.tokens import load_tokenizer
from tools import lstm_lm

TEXTS = [f"the {w} value of a list is a string in python module {i}" for i, w in enumerate("abcdefgh" * 4)]
IDS = torch.tensor([[5, 9, 2, 17, 3, 40, 8, 1], [7, 7, 30, 2, 0, 0, 0, 0]])


def lstm(vocab: int, tied: bool = False, seed: int = 0) -> lstm_lm.LSTMLM:
    torch.manual_seed(seed)
    return lstm_lm.LSTMLM(lstm_lm.LSTMConfig(vocab, dim=16, layers=2, tied=tied)).eval()


def own(module) -> OwnLM:
    return OwnLM(module, embedding="embedding", head="decoder")


def test_it_round_trips_through_its_own_save_and_load(tmp_path):
    for tied in (False, True):
        model = lstm(60, tied)
        lstm_lm.save(model, tmp_path)
        again = lstm_lm.load(tmp_path)
        torch.testing.assert_close(again(IDS), model(IDS), rtol=1e-4, atol=1e-5)
        assert (again.decoder.weight is again.embedding.weight) == tied


def test_wrapped_it_is_an_lm_that_exports_with_parity(tmp_path):
    model = own(lstm(60))
    assert kind_of(model).name == "own-lm"
    assert model(IDS).shape == (2, 8, 60)
    assert export_onnx(model, tmp_path / "lstm.onnx").parity_max_abs < 1e-4


def test_a_natively_tied_one_computes_its_logits_through_the_one_table(tmp_path):
    model = own(lstm(60, tied=True))
    before = model(IDS)
    kind_of(model).tie_(model)
    assert isinstance(model.module.decoder, TiedLogits) and model.module.decoder.bias is not None
    torch.testing.assert_close(model(IDS), before, rtol=1e-4, atol=1e-5)


def test_tied_compressed_finetuned_and_exported_by_module_name(tiny_gpt2_dir, tmp_path):
    tokenizer = load_tokenizer(tiny_gpt2_dir)
    teacher = own(lstm(len(tokenizer), seed=1))
    model = own(lstm(len(tokenizer), seed=1))
    table_before = sum(p.numel() for p in model.parameters())
    plan = Plan((("embedding", LowRankConfig(rank=4, fit="plain")),), tie=TieConfig("output"))
    compress_(model, plan)
    head = model.module.decoder
    assert isinstance(head, TiedLogits) and isinstance(head.embedding, LowRankEmbedding)
    assert head.embedding is model.module.embedding
    assert sum(p.numel() for p in model.parameters()) < table_before - len(tokenizer) * 16
    cfg = FinetuneConfig(steps=4, seconds=None, batch_size=4, eval_every=2, trainable="all", layer_weight=0.0)
    report = finetune_(
        Distillation(model, teacher, tokenizer, TEXTS[:24], TEXTS[24:], tuple(compact_modules().values())), cfg
    )
    assert report.steps == 4 and report.best_val_cosine >= report.start_val_cosine
    assert export_onnx(model, tmp_path / "tied.onnx").parity_max_abs < 1e-4


def test_the_head_is_named_and_never_a_body_target():
    model = own(lstm(60))
    assert list(match_plan(Plan((("head", LowRankConfig(rank=4)),)), model)) == ["module.decoder"]
    with pytest.raises(PlanError, match="names 'linear' but the model has no such module"):
        match_plan(Plan((("linear", LowRankConfig(rank=4)),)), model)


def test_bad_names_and_saving_through_the_toolkit_are_refused(tmp_path):
    with pytest.raises(CompressorError, match="'encoder' is no module of the LSTMLM"):
        OwnLM(lstm(60), embedding="encoder", head="decoder")
    headless = OwnLM(lstm(60), embedding="embedding")
    with pytest.raises(CompressorError, match="no output projection to tie"):
        tie_(headless, TieConfig())
    with pytest.raises(CompressorError, match="your own code"):
        save_compressed(own(lstm(60)), Plan((), tie=TieConfig()), CompressionReport(), tmp_path, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()
