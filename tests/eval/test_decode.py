"""Decoding a causal LM's cached graph on ONNX Runtime (eval.decode) against PyTorch, and `generate`
end to end with every bad input refused."""

import numpy as np
import pytest
import torch

from converters.checkpoint import load_model
from eval.decode import Decoder, decode_ids, decode_times
from eval.graph import make_session
from tests.conftest import run_cli, write_tiny_lm

STEPS = 10


@pytest.fixture(scope="module", params=["llama", "gpt2", "llama-fused", "gemma3", "gemma3-fused"])
def lm_folder(request, tiny_llama_dir, tiny_gpt2_dir, tmp_path_factory):
    """(the model, its ready folder from `compressor export`) for a tiny Llama and a tiny GPT-2, traced, a
    tiny Llama whose heads of 16 dimensions GroupQueryAttention takes: the fused decoder's graph, and a tiny
    Gemma 3 whose local layers attend to a window of 4 positions, traced (heads of 24) and fused (of 32)."""
    from converters.cli import main

    def tiny(arch: str, **shape):
        return lambda: write_tiny_lm(tmp_path_factory.mktemp("lm") / arch, arch, hidden=64, **shape)

    source = {
        "llama": lambda: tiny_llama_dir,
        "gpt2": lambda: tiny_gpt2_dir,
        "llama-fused": tiny("llama"),
        "gemma3": tiny("gemma3", head_dim=24),
        "gemma3-fused": tiny("gemma3", head_dim=32),
    }[request.param]()
    out = tmp_path_factory.mktemp("lm") / request.param
    assert main(["export", str(source), "--out", str(out)]) == 0
    return load_model(source)[0], out


def test_each_cached_step_gives_the_uncached_models_logits(lm_folder):
    model, folder = lm_folder
    session = make_session(folder / "onnx/model.onnx")
    ids = [3, 7, 11, 5, 9]
    decoder = Decoder(session)
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
    roomy, tight = Decoder(session), Decoder(session)
    first = roomy.start(np.arange(5))  # room for every step
    monkeypatch.setattr("eval.decode.SHARED_START", 1)  # the buffers grow every few steps
    pairs = [(first, tight.start(np.arange(5)))]
    pairs += [(roomy.step(t), tight.step(t)) for t in (3, 1, 4, 1, 5, 9, 2)]
    assert all(np.array_equal(a, b) for a, b in pairs)
    assert tight.shared == folder.name.endswith("-fused")


def test_a_lean_prompt_pass_gives_the_same_logits(lm_folder):
    _, folder = lm_folder
    session = make_session(folder / "onnx/model.onnx")
    kept, lean = Decoder(session), Decoder(session, shrink=True)  # its arena shrunk, its logits in an array
    pairs = [(kept.start(np.arange(7)), lean.start(np.arange(7)))]
    pairs += [(kept.step(t), lean.step(t)) for t in (3, 1, 4, 1, 5)]
    assert all(np.array_equal(a, b) for a, b in pairs)


def test_presents_have_the_declared_shapes(lm_folder):
    model, folder = lm_folder
    session = make_session(folder / "onnx/model.onnx")
    decoder = Decoder(session)
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


def test_decode_times_cover_every_step(lm_folder):
    _, folder = lm_folder
    times = decode_times(make_session(folder / "onnx/model.onnx"), np.arange(8), 5)
    summary = times.summary()
    assert len(times.step_ms) == 5 and summary["tokens_per_s"] > 0 and summary["prefill_ms"] > 0


def test_generate_prints_the_continuation_and_sampling_follows_its_seed(lm_folder, capsys):
    _, folder = lm_folder
    argv = ("generate", folder, "--prompt", "the value of", "--max-new-tokens", 4)
    code, greedy, err = run_cli(capsys, *argv)
    assert code == 0 and greedy.startswith("the value of"), err
    sampled = [run_cli(capsys, *argv, "--sample", "--seed", 7)[1] for _ in range(2)]
    assert sampled[0] == sampled[1]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (("--max-new-tokens", 0), "at least 1"),
        (("--max-new-tokens", 200), "exceed the model's context of 160"),
        (("--sample", "--temperature", 0), "temperature > 0"),
        (("--tokenizer", "{empty}"), "no tokenizer"),
    ],
)
def test_bad_generate_input_is_one_sentence(lm_folder, tmp_path, capsys, extra, said):
    _, folder = lm_folder
    (tmp_path / "empty").mkdir()
    extra = [str(e).format(empty=tmp_path / "empty") for e in extra]
    code, _, err = run_cli(capsys, "generate", folder, "--prompt", "the cat", *extra)
    assert code == 2 and said in err, err


def test_an_encoders_graph_is_refused(tiny_bert_dir, tmp_path, capsys):
    assert run_cli(capsys, "export", tiny_bert_dir, "--out", tmp_path / "enc")[0] == 0
    code, _, err = run_cli(capsys, "generate", tmp_path / "enc", "--prompt", "a")
    assert code == 2 and "encoder kind" in err


def test_in_pairs_the_first_graph_takes_turns_with_each_other_one_alone(monkeypatch):
    import weakref

    from eval import decode

    made, turns = [], []

    class Session:
        def __init__(self, path):
            self.path = path
            made.append(weakref.ref(self))

    def timed(session, context, new_tokens, shrink):
        turns.append((session.path, sum(ref() is not None for ref in made)))
        return decode.DecodeTimes(1.0, [1.0] * new_tokens)

    def session_of(path, threads):
        turns.append(("made", sum(ref() is not None for ref in made)))
        return Session(path)

    monkeypatch.setattr(decode, "make_session", session_of)
    monkeypatch.setattr(decode, "decode_times", timed)
    out = decode.measure_decode(["fp32", "int8", "int4"], np.arange(4), (4,), 2, 3, progress=False, pairs=True)
    assert max(held for _, held in turns) == 2  # two sessions at once, not three, a run's gone before the next's
    counts = {path: sum(p == path for p, _ in turns) for path in ("fp32", "int8", "int4")}
    assert counts == {"fp32": 8, "int8": 4, "int4": 4}  # beside each row in turn: 4 turns (a warm-up and 3) each
    assert len(out) == 3 and all(row["ctx4"]["per_token_p50_ms"] == 1.0 for row in out)


def test_a_graph_that_fails_to_decode_leaves_the_turns_and_says_why(monkeypatch):
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    from eval import decode

    tried = []

    def timed(session, context, new_tokens, shrink):
        tried.append((session, len(context)))
        if session == "int8" and len(context) == 8:  # its window's cache breaks at the longer context
            raise Fail("Shape mismatch attempting to re-use buffer.\nmore")
        return decode.DecodeTimes(1.0, [1.0] * new_tokens)

    monkeypatch.setattr(decode, "make_session", lambda path, threads: path)
    monkeypatch.setattr(decode, "decode_times", timed)
    out = decode.measure_decode(["fp32", "int8", "int4"], np.arange(4), (4, 8), 2, 3, progress=False, pairs=True)
    said = "decoding after 8 tokens of context failed: Shape mismatch attempting to re-use buffer."
    assert out[1] == {"failed": said}  # its first line
    assert out[0]["ctx8"]["per_token_p50_ms"] == out[2]["ctx8"]["per_token_p50_ms"] == 1.0
    assert tried.count(("int8", 8)) == 1  # not tried again once failed
