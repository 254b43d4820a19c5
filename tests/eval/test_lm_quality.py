"""A language model's quality metrics on next-token predictions (eval.quality.next_tokens)."""

from types import SimpleNamespace

import numpy as np
import pytest

from eval import quality
from eval.quality import next_token_quality, next_tokens


class FakeSession:
    """An ONNX Runtime session stand-in that returns fixed logits (B, T, V)."""

    def __init__(self, logits: np.ndarray):
        self.logits = logits.astype(np.float32)

    def get_inputs(self):
        return [SimpleNamespace(name="input_ids"), SimpleNamespace(name="attention_mask")]

    def get_outputs(self):
        return [SimpleNamespace(name="logits", shape=["batch", "sequence", self.logits.shape[-1]])]

    def run(self, names, feed):
        return [self.logits[: feed["input_ids"].shape[0], : feed["input_ids"].shape[1]]]


def feed(batch=3, seq=6, vocab=11, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[-1, seq // 2 :] = 0
    return [{"input_ids": rng.integers(0, vocab, (batch, seq)), "attention_mask": mask}]


def test_a_model_that_predicts_uniformly_has_perplexity_v():
    batches = feed(vocab=11)
    uniform = next_tokens(FakeSession(np.zeros((3, 6, 11))), "logits", batches)
    assert next_token_quality(uniform, uniform)["perplexity"] == pytest.approx(11.0, rel=1e-5)
    assert len(uniform.nll) == 3 * 5 - 3  # the padded row predicts only among its real tokens


def full_kl(p_logits, q_logits, batches):
    mask = batches[0]["attention_mask"].astype(bool)
    real = mask[:, :-1] & mask[:, 1:]
    p = quality._log_softmax(p_logits[:, :-1][real])
    q = quality._log_softmax(q_logits[:, :-1][real])
    return float((np.exp(p) * (p - q)).sum(1).mean())


def test_kl_is_exact_when_the_top_holds_the_vocabulary_and_a_lower_bound_otherwise(monkeypatch):
    rng = np.random.default_rng(1)
    p_logits, q_logits = rng.normal(size=(3, 6, 11)) * 3, rng.normal(size=(3, 6, 11)) * 3
    batches = feed()
    exact = full_kl(p_logits, q_logits, batches)
    ref = next_tokens(FakeSession(p_logits), "logits", batches)
    other = next_tokens(FakeSession(q_logits), "logits", batches, ref)
    got = next_token_quality(ref, other)
    assert got["kl_mean"] == pytest.approx(exact, rel=1e-5)
    assert 0 <= got["top1_agreement"] <= 1 and next_token_quality(ref, ref)["top1_agreement"] == 1.0
    monkeypatch.setattr(quality, "KL_TOP", 3)
    ref = next_tokens(FakeSession(p_logits), "logits", batches)
    coarse = next_token_quality(ref, next_tokens(FakeSession(q_logits), "logits", batches, ref))["kl_mean"]
    assert 0 < coarse <= exact + 1e-9
    assert next_token_quality(ref, ref)["kl_mean"] == pytest.approx(0.0, abs=1e-9)


def test_a_block_of_rows_at_a_time_gives_what_the_whole_chunk_gives(monkeypatch):
    from eval import probe

    rng = np.random.default_rng(2)
    p_logits, q_logits = rng.normal(size=(3, 6, 11)) * 3, rng.normal(size=(3, 6, 11)) * 3
    batches = feed()
    ref = next_tokens(FakeSession(p_logits), "logits", batches)
    whole = next_token_quality(ref, next_tokens(FakeSession(q_logits), "logits", batches, ref))
    monkeypatch.setattr(probe, "BLOCK_BYTES", 2 * 11 * 8)  # two predictions a block
    blocked_ref = next_tokens(FakeSession(p_logits), "logits", batches)
    for field in vars(ref):
        np.testing.assert_array_equal(getattr(blocked_ref, field), getattr(ref, field))
    blocked = next_token_quality(blocked_ref, next_tokens(FakeSession(q_logits), "logits", batches, blocked_ref))
    assert blocked == pytest.approx(whole, rel=1e-12)
