"""The general-English token-frequency prior and its blend with calibration counts."""

import importlib.util

import pytest
import torch

from compressor.errors import CompressorError
from converters.calibration import Calibration
from converters.checkpoint import load_model
from converters.cli import build_parser
from converters.cli.specs import finetune_config, method_spec, text_spec
from converters.pipeline.checks import check_method_options
from texts.prior import check_prior, prior_for, save_prior, token_prior
from texts.tokens import load_tokenizer

CODE_WORDS = ["def", "class", "return", "import", "while", "loop", "dict", "list"]


@pytest.fixture
def tokenizer(tiny_bert_dir):
    return load_tokenizer(load_model(tiny_bert_dir)[1])


def code_only_calibration(tokenizer) -> Calibration:
    """Counts as from a text of code words alone: no 'the', 'of', 'and'."""
    counts = torch.zeros(tokenizer.vocab_size, dtype=torch.long)
    for i, word in enumerate(CODE_WORDS):
        counts[tokenizer.convert_tokens_to_ids(word)] = 100 - i
    return Calibration({}, counts, tuple(tokenizer.all_special_ids))


def test_the_prior_is_a_distribution_led_by_the_commonest_english_words(tokenizer):
    prior = token_prior(tokenizer, tokenizer.vocab_size)
    assert prior.dtype == torch.float64 and float(prior.sum()) == pytest.approx(1.0)
    the, of, loop = tokenizer.convert_tokens_to_ids(["the", "of", "loop"])
    assert prior[the] > prior[of] > prior[loop] > 0


class _Wrapped:
    """The tokenizer as transformers calls it, its Rust tokenizer out of reach: the prior takes its other road."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)


def test_the_rust_tokenizer_s_road_gives_transformers_prior(tokenizer):
    fast, called = (token_prior(t, tokenizer.vocab_size) for t in (tokenizer, _Wrapped(tokenizer)))
    assert torch.allclose(fast, called, rtol=1e-12, atol=0)


def test_the_blend_keeps_the_total_and_weighs_unseen_tokens(tokenizer):
    calib = code_only_calibration(tokenizer)
    prior = token_prior(tokenizer, tokenizer.vocab_size)
    blended = calib.with_prior(prior, 0.25)
    n = calib.counts.sum().to(torch.float64)
    assert torch.allclose(blended.counts, 0.75 * calib.counts + 0.25 * n * prior, atol=1e-6)
    assert float(blended.counts.sum()) == pytest.approx(float(n))
    the = tokenizer.convert_tokens_to_ids("the")
    assert calib.counts[the] == 0 and blended.counts[the] > 0  # never seen, still weighed
    assert torch.equal(calib.with_prior(prior, 0.0).counts, calib.counts.to(torch.float64))


def test_the_head_holds_the_commonest_english_tokens_the_calibration_text_lacks(tokenizer):
    calib = code_only_calibration(tokenizer)
    prior = token_prior(tokenizer, tokenizer.vocab_size)
    specials = len(tokenizer.all_special_ids)
    head = set(calib.with_prior(prior, 0.5).head_tokens(specials + 60).tolist())
    common = tokenizer.convert_tokens_to_ids(["the", "of", "and", "to", "a", "in"])
    assert set(common) <= head
    assert not set(common) & set(calib.head_tokens(specials + 60).tolist())  # the counts alone miss them


@pytest.mark.parametrize(
    "prior, weight, message",
    [
        ("zipf", 0.5, "one of wordfreq, none or a saved prior"),
        ("wordfreq", 1.5, r"\[0, 1\]"),
        ("none", -0.1, r"\[0, 1\]"),
        ("missing.safetensors", 0.5, "does not exist"),
    ],
)
def test_bad_prior_options_are_refused(prior, weight, message):
    with pytest.raises(CompressorError, match=message):
        check_prior(prior, weight)


def test_a_missing_wordfreq_says_how_to_install_it_before_any_work(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wordfreq" else real(name, *a))
    with pytest.raises(CompressorError, match=r"pip install wordfreq.*--freq-prior none"):
        check_method_options(*_specs("run", "--method", "lowrank", "--keep", "0.25", "--out", "unused"))
    check_method_options(*_specs("run", "--method", "lowrank", "--freq-prior", "none"))
    with pytest.raises(CompressorError, match=r"pip install wordfreq, or pass --synthetic 0"):
        finetune_config(vars(build_parser().parse_args(["finetune", "ckpt", "--synthetic", "0.25"])))


def _specs(*argv: str):
    """The method and text specs of a command line."""
    values = vars(build_parser().parse_args(argv))
    return method_spec(values), text_spec(values)


def test_a_missing_calibration_text_is_refused_before_any_work(tmp_path):
    with pytest.raises(CompressorError, match="does not exist"):
        check_method_options(*_specs("run", "--method", "lowrank", "--keep", "0.25", "--calib", str(tmp_path / "no")))


def test_a_saved_prior_reads_back_as_wordfreq_s_and_must_fit_the_vocabulary(tokenizer, tmp_path):
    prior = token_prior(tokenizer, tokenizer.vocab_size)
    save_prior(tmp_path / "prior.safetensors", prior)
    path = str(tmp_path / "prior.safetensors")
    check_prior(path, 0.5)
    assert torch.equal(prior_for(path, tokenizer, tokenizer.vocab_size), prior)  # float64 kept bit for bit
    with pytest.raises(CompressorError, match="not this model's"):
        prior_for(path, tokenizer, tokenizer.vocab_size + 1)
    (tmp_path / "cut.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CompressorError, match="cannot be read"):
        check_prior(str(tmp_path / "cut.safetensors"), 0.5)  # before any work
    save_prior(tmp_path / "counts.safetensors", prior * 7)
    with pytest.raises(CompressorError, match="holds no frequency prior"):
        check_prior(str(tmp_path / "counts.safetensors"), 0.5)
