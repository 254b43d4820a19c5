"""The architectures users bring, each a tiny random model of the pinned transformers: `run` plans,
compresses (low rank on every body linear layer), saves the checkpoint, exports it with parity, adds
the original's quantized rows and benches them; the checkpoint loads back to what its graph computes.
README's support table is this list."""

import copy
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from converters.calibration import calibrate
from converters.checkpoint import load_model, save_compressed
from converters.compress import compress_
from converters.export import export_onnx
from converters.kinds import kind_of
from converters.methods.define import DefineConfig
from converters.methods.lowrank import LowRankConfig
from converters.methods.phm import PHMConfig
from converters.methods.tt import TTConfig
from converters.plan import Plan, match_plan
from eval.graph import make_session
from eval.probe import full_feed
from tests.conftest import run_cli, write_tiny_bert, write_tiny_lm
from texts.tokens import load_tokenizer

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
SMALL["pad_token_id"] = 0
POSITIONS = {"max_position_embeddings": 160}


def _encoders():
    import transformers as t

    return {
        "bert": lambda v: t.BertModel(t.BertConfig(vocab_size=v, max_position_embeddings=160, **SMALL)),
        "roberta": lambda v: t.RobertaModel(t.RobertaConfig(vocab_size=v, max_position_embeddings=170, **SMALL)),
        "xlm-roberta": lambda v: t.XLMRobertaModel(
            t.XLMRobertaConfig(vocab_size=v, max_position_embeddings=170, **SMALL)
        ),
        "distilbert": lambda v: t.DistilBertModel(
            t.DistilBertConfig(
                vocab_size=v, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=160, pad_token_id=0
            )
        ),
        "mpnet": lambda v: t.MPNetModel(t.MPNetConfig(vocab_size=v, max_position_embeddings=170, **SMALL)),
        "deberta-v2": lambda v: t.DebertaV2Model(t.DebertaV2Config(vocab_size=v, **POSITIONS, **SMALL)),
        "modernbert": lambda v: t.ModernBertModel(t.ModernBertConfig(vocab_size=v, **POSITIONS, **SMALL)),
        "electra": lambda v: t.ElectraModel(
            t.ElectraConfig(vocab_size=v, embedding_size=32, max_position_embeddings=160, **SMALL)
        ),
    }


def _lms():
    import transformers as t

    ids = {"bos_token_id": 0, "eos_token_id": 0, "max_position_embeddings": 160}
    small = {**SMALL, "num_key_value_heads": 2, **ids}
    return {
        "qwen2": lambda v: t.Qwen2ForCausalLM(t.Qwen2Config(vocab_size=v, tie_word_embeddings=True, **small)),
        "qwen3": lambda v: t.Qwen3ForCausalLM(
            t.Qwen3Config(vocab_size=v, head_dim=8, tie_word_embeddings=True, **small)
        ),
        "gemma": lambda v: t.GemmaForCausalLM(t.GemmaConfig(vocab_size=v, head_dim=8, **small)),
        "phi3": lambda v: t.Phi3ForCausalLM(t.Phi3Config(vocab_size=v, tie_word_embeddings=False, **small)),
    }


ENCODERS = ["bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "deberta-v2", "modernbert", "electra"]
LMS = ["llama", "gpt2", "qwen2", "qwen3", "gemma", "phi3"]


def _model_dir(arch: str, root: Path) -> Path:
    """A tiny random model of `arch` with a tokenizer of ours, saved as transformers saves it."""
    path = root / arch
    if arch in ("llama", "gpt2"):
        return write_tiny_lm(path, arch)
    encoder = arch in ENCODERS
    tokenizer_from = write_tiny_bert(root / "bert-tokenizer") if encoder else write_tiny_lm(root / "lm", "llama")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
    build = {**_encoders(), **_lms()}[arch]
    torch.manual_seed(0)
    model = build(json.loads((tokenizer_from / "config.json").read_text())["vocab_size"]).eval()
    path.mkdir(parents=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("arch", ENCODERS + LMS)
def test_run_compresses_exports_quantizes_and_benches(arch, tmp_path, eval_text_file, lm_text, capsys):
    source = _model_dir(arch, tmp_path / "models")
    text = lm_text if arch in LMS else eval_text_file
    out = tmp_path / "run"
    argv = ("run", source, "--method", "lowrank", "--kind", "plain", "--rank", 4, "--targets", "linear")
    texts = ("--calib", text, "--eval-text", text, "--second-text", text, "--runs", 1)
    code, _, err = run_cli(capsys, *argv, *texts, "--out", out)
    assert code == 0, err
    rows = {v["name"]: v for v in json.loads((out / "report.json").read_text())["variants"]}
    lm_rows = ["original-int8", "original-w8", "original-int4", "original-int4-aware"]
    baselines = lm_rows if arch in LMS else ["original-int8"]
    assert list(rows)[: 1 + len(baselines)] == ["original", *baselines]
    (name,) = [n for n in rows if n.startswith("lowrank")]
    assert rows[name]["params"] < rows["original"]["params"]
    model, _ = load_model(out / name)  # the checkpoint loads back to what its graph computes
    session = make_session(out / name / "onnx" / "model.onnx")
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(5, vocab, (2, 9), generator=torch.Generator().manual_seed(1))
    feed = full_feed(session, {"input_ids": ids.numpy(), "attention_mask": np.ones((2, 9), dtype=np.int64)})
    got = session.run(None, feed)[0]
    with torch.no_grad():
        out_ = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    expected = (out_.logits if arch in LMS else out_.last_hidden_state).numpy()
    assert np.abs(got - expected).max() <= 1e-3 * max(1.0, float(np.abs(expected).max()))


def _plans() -> dict[str, Plan]:
    """Each method on what it takes, with its data-aware fit where it has one (fisher: the heaviest)."""
    return {
        "tt": Plan((("embeddings", TTConfig(fit="fisher", rank=4, dense_head=8)),)),
        "define": Plan((("embeddings", DefineConfig(n=8, k=32, layers=2, max_groups=2, fit="fisher")),)),
        "phm": Plan((("linear", PHMConfig(n=4, terms=2, fit="fisher")),)),
        "lowrank": Plan((("linear", LowRankConfig(fit="fisher", rank=4)),)),
    }


@pytest.mark.parametrize("arch", ENCODERS + LMS)
def test_every_method_compresses_and_exports_with_parity(arch, tmp_path, eval_text_file, lm_text):
    """TT, DeFINE, PHM and low rank, each with its fisher fit (calibration with output sensitivities of
    the kind's loss), compress the model, export its graph within the kind's parity tolerance and save a
    checkpoint that loads back to the same outputs; a tied LM head computes through the compressed
    table. (The original's int8 row is the run test's: a random tiny model's compressed graph may be
    past the int8 gate.)"""
    source = _model_dir(arch, tmp_path / "models")
    text = (lm_text if arch in LMS else eval_text_file).read_text().splitlines()
    original, _ = load_model(source)
    tokenizer = load_tokenizer(source)
    plans = _plans()
    linear = sorted(n for n in match_plan(plans["lowrank"], original))
    calib = calibrate(original, tokenizer, text, linear, progress=False, sensitivity=True)
    for name, plan in plans.items():
        model = copy.deepcopy(original)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # singular Grams of a random tiny model, clamped ranks
            report = compress_(model, plan, calib, progress=False)
        assert report.modules, f"{arch}: {name} compressed nothing ({report.skipped})"
        assert sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in original.parameters())
        assert export_onnx(model, tmp_path / f"{name}.onnx").path.is_file()  # raises past the kind's parity tolerance
        saved = save_compressed(model, plan, report, source, tmp_path / name)
        again, _ = load_model(saved)  # the checkpoint round trip: the same outputs
        ids = torch.randint(
            5, again.get_input_embeddings().num_embeddings, (2, 7), generator=torch.Generator().manual_seed(2)
        )
        with torch.no_grad():
            want, got = (kind_of(m).output(m, ids, torch.ones_like(ids)) for m in (model, again))
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), f"{arch}: {name} loads back other outputs"
