"""Decoding a causal LM's graph on ONNX Runtime (decoding.decoders: each decoder a session takes; decoding.sampling)
against PyTorch."""

import numpy as np
import pytest
import torch

from decoding.decoders import BoundDecoder, open_decoder
from decoding.sampling import decode_ids
from eval.graph import make_session

STEPS = 10


def test_each_cached_step_gives_the_uncached_models_logits(lm_folder):
    model, folder = lm_folder
    session = make_session(folder / "onnx/model.onnx")
    ids = [3, 7, 11, 5, 9]
    decoder = open_decoder(session)
    logits = decoder.start(np.array(ids))
    for _ in range(STEPS):
        with torch.no_grad():
            expected = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].numpy()
        scale = float(np.abs(expected).max())
        assert np.abs(logits - expected).max() <= 1e-4 * max(scale, 1.0)
        ids.append(int(np.argmax(logits)))
        logits = decoder.step(ids[-1])


def test_a_shared_cache_grows_without_changing_the_logits(lm_folder, monkeypatch):
    _, folder = lm_folder
    session = make_session(folder / "onnx/model.onnx")
    roomy, tight = open_decoder(session), open_decoder(session)
    first = roomy.start(np.arange(5))  # room for every step
    monkeypatch.setattr("decoding.decoders.SHARED_START", 1)  # the buffers grow every few steps
    pairs = [(first, tight.start(np.arange(5)))]
    pairs += [(roomy.step(t), tight.step(t)) for t in (3, 1, 4, 1, 5, 9, 2)]
    assert all(np.array_equal(a, b) for a, b in pairs)
    assert isinstance(tight, BoundDecoder) == folder.name.endswith("-fused")


def test_a_lean_prompt_pass_gives_the_same_logits(lm_folder):
    _, folder = lm_folder
    session = make_session(folder / "onnx/model.onnx")
    kept, lean = open_decoder(session), open_decoder(session, shrink=True)  # its arena shrunk, its logits in an array
    pairs = [(kept.start(np.arange(7)), lean.start(np.arange(7)))]
    pairs += [(kept.step(t), lean.step(t)) for t in (3, 1, 4, 1, 5)]
    assert all(np.array_equal(a, b) for a, b in pairs)


def test_a_prompt_read_in_pieces_gives_the_logits_of_one_pass(lm_folder, monkeypatch):
    _, folder = lm_folder
    session = make_session(folder / "onnx/model.onnx")
    whole, pieces = open_decoder(session), open_decoder(session)
    expected = [whole.start(np.arange(7))] + [whole.step(t) for t in (3, 1, 4)]
    if not isinstance(pieces, BoundDecoder):
        pytest.skip("a fed graph reads its prompt in one pass")
    passes = []
    bound = BoundDecoder._bound
    monkeypatch.setattr(
        BoundDecoder, "_bound", lambda self, new, options=None: passes.append(new.shape[1]) or bound(self, new, options)
    )
    width = next(o.shape[-1] for o in session.get_outputs() if o.name == "logits")
    monkeypatch.setattr("decoding.decoders.PROMPT_LOGITS_BYTES", 2 * 4 * width)  # two tokens' logits a pass
    got = [pieces.start(np.arange(7))] + [pieces.step(t) for t in (3, 1, 4)]
    assert passes == [2, 2, 2, 1, 1, 1, 1]  # the prompt in four passes, then a step a pass
    scale = max(float(np.abs(np.stack(expected)).max()), 1.0)
    assert all(np.abs(a - b).max() <= 1e-5 * scale for a, b in zip(expected, got))


def test_presents_have_the_declared_shapes(lm_folder):
    model, folder = lm_folder
    session = make_session(folder / "onnx/model.onnx")
    decoder = open_decoder(session)
    decoder.start(np.arange(6))
    decoder.step(1)
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    assert len(decoder.past) == 2 * config.num_hidden_layers
    assert {v.shape for v in decoder.past.values()} == {(1, heads, 7, head_dim)}


def test_greedy_decoding_equals_transformers_generate(lm_folder):
    model, folder = lm_folder
    session = make_session(folder / "onnx/model.onnx")
    for prompt in ([3, 7, 11], [20, 4, 4, 9, 13, 2]):
        with torch.no_grad():
            theirs = model.generate(torch.tensor([prompt]), max_new_tokens=STEPS, do_sample=False)[0, len(prompt) :]
        assert decode_ids(session, np.array(prompt), STEPS, eos=model.config.eos_token_id) == theirs.tolist()


class _Counted:
    """A session whose passes' new lengths are noted."""

    def __init__(self, session):
        self.session, self.passes = session, []

    def get_inputs(self):
        return self.session.get_inputs()

    def get_outputs(self):
        return self.session.get_outputs()

    def run(self, names, feed):
        self.passes.append(feed["input_ids"].shape[1])
        return self.session.run(names, feed)


def test_the_memory_probe_decodes_as_a_decoder_does(lm_folder, monkeypatch):
    """eval.probe.decoded, an LM's memory probe: a prompt in pieces of its logits' bound, then a token a pass, each
    pass's logits the decoder's own after the same tokens."""
    from eval.probe import decoded, is_cached, random_batch

    _, folder = lm_folder
    session = _Counted(make_session(folder / "onnx/model.onnx"))
    width = next(o.shape[-1] for o in session.get_outputs() if o.name == "logits")
    monkeypatch.setattr("eval.probe.OUTPUT_CHUNK_BYTES", 3 * 4 * width)  # three tokens' logits a pass
    seen = []
    tokens = decoded(session, 7, width, 4, seen=lambda logits: seen.append(logits.copy()))
    cached = is_cached(session)
    assert session.passes == ([3, 2, 2, 1, 1, 1, 1] if cached else [7, 8, 9, 10, 11])
    decoder = open_decoder(session.session)
    expected = [decoder.start(random_batch(1, 7, width)["input_ids"][0])] + [decoder.step(t) for t in tokens]
    assert len(tokens) == 4 and len(seen) == 5
    scale = max(float(np.abs(np.stack(expected)).max()), 1.0)
    assert all(np.abs(a - b).max() <= 1e-5 * scale for a, b in zip(expected, seen))
