"""A stopped fine-tune resumed from its state ends where the same fine-tune unstopped ends; a state of
another fine-tune, a missing one and one cut short are refused; the state is written whole."""

import pytest
import torch

import converters.finetune.distil as ft
from compressor.errors import CompressorError
from converters.checkpoint import load_model
from converters.compress import compress_
from converters.finetune import Distillation, FinetuneRun, finetune_
from converters.finetune.config import FinetuneConfig
from converters.methods.tt import TTConfig
from converters.plan import Plan
from converters.registry import compact_modules
from texts.tokens import load_tokenizer

TEXTS = [f"the {w} value of a list is a string in python module number {i}" for i, w in enumerate("abcdefgh" * 4)]
COMPACT = tuple(compact_modules().values())
CFG = FinetuneConfig(steps=30, seconds=None, lr=1e-2, batch_size=8, eval_every=5, rare_share=0.5)


def _pair(tiny_bert_dir, rank=2):
    """(student, teacher, tokenizer): a fresh student, as a new process would load it."""
    teacher, source = load_model(tiny_bert_dir)
    student, _ = load_model(tiny_bert_dir)
    compress_(student, Plan((("embeddings", TTConfig(rank=rank, order="none")),)), progress=False)
    return student, teacher, load_tokenizer(source)


def _tune(pair, **kw):
    student, teacher, tok = pair
    return finetune_(
        Distillation(student, teacher, tok, TEXTS, TEXTS[:8], COMPACT), CFG, FinetuneRun(progress=False, **kw)
    )


@pytest.fixture
def stopped(tiny_bert_dir, tmp_path, monkeypatch):
    """The state file of CFG's fine-tune stopped (as by Ctrl-C) within its 16th step."""
    real = ft._lr_factor

    def stop_at_15(cfg, step, elapsed):  # called between the step's backward and its update
        if step == 15:
            raise KeyboardInterrupt
        return real(cfg, step, elapsed)

    monkeypatch.setattr(ft, "_lr_factor", stop_at_15)
    state = tmp_path / "ft.state"
    report = _tune(_pair(tiny_bert_dir), state=state)
    monkeypatch.setattr(ft, "_lr_factor", real)
    assert report.steps == 15 and "--resume goes on" in report.stopped
    assert [p.name for p in tmp_path.iterdir()] == ["ft.state"]  # written whole: no temporary left beside it
    return state


def test_resumed_ends_where_unstopped_ends(tiny_bert_dir, stopped):
    whole_pair, resumed_pair = _pair(tiny_bert_dir), _pair(tiny_bert_dir)
    whole = _tune(whole_pair)
    resumed = _tune(resumed_pair, state=stopped, resume=True)
    assert resumed.steps == whole.steps == 30 and not resumed.stopped
    assert resumed.best_val_cosine == pytest.approx(whole.best_val_cosine, abs=1e-4)
    assert resumed.best_step == whole.best_step and len(resumed.losses) == len(whole.losses)
    ours, theirs = resumed_pair[0].state_dict(), whole_pair[0].state_dict()
    assert all(torch.allclose(ours[k], theirs[k], atol=1e-4) for k in theirs)
    fresh = _pair(tiny_bert_dir)[0].state_dict()  # and the steps did move the weights
    assert not all(torch.allclose(fresh[k], theirs[k], atol=1e-4) for k in theirs)


def test_a_state_of_another_fine_tune_is_refused(tiny_bert_dir, stopped, monkeypatch):
    with pytest.raises(CompressorError, match="another model or plan"):
        _tune(_pair(tiny_bert_dir, rank=3), state=stopped, resume=True)
    monkeypatch.setattr(__import__(__name__), "CFG", FinetuneConfig(steps=40, seconds=None, lr=1e-2, batch_size=8))
    with pytest.raises(CompressorError, match="other settings: .*steps 30 there, 40 here"):
        _tune(_pair(tiny_bert_dir), state=stopped, resume=True)


def test_a_missing_or_cut_state_is_refused(tiny_bert_dir, stopped, tmp_path):
    with pytest.raises(CompressorError, match="no fine-tune state"):
        _tune(_pair(tiny_bert_dir), state=tmp_path / "none.state", resume=True)
    cut = tmp_path / "cut.state"
    cut.write_bytes(stopped.read_bytes()[:1000])
    with pytest.raises(CompressorError, match="not a whole fine-tune state"):
        _tune(_pair(tiny_bert_dir), state=cut, resume=True)
    with pytest.raises(CompressorError, match="give its file"):
        _tune(_pair(tiny_bert_dir), resume=True)
