"""What decoding costs per token (eval.decode_timing): every step timed, and the graphs taking turns."""

import numpy as np
import pytest

from eval.decode_timing import decode_times
from eval.graph import make_session


@pytest.fixture(scope="module")
def lm_graph(tiny_llama_dir, tmp_path_factory):
    """A tiny Llama's graph, exported."""
    from converters.cli import main

    out = tmp_path_factory.mktemp("lm") / "llama"
    assert main(["export", str(tiny_llama_dir), "--out", str(out)]) == 0
    return out / "onnx/model.onnx"


def test_decode_times_cover_every_step(lm_graph):
    times = decode_times(make_session(lm_graph), np.arange(8), 5)
    summary = times.summary()
    assert len(times.step_ms) == 5 and summary["tokens_per_s"] > 0 and summary["prefill_ms"] > 0


def test_each_turn_makes_its_graphs_session_and_lets_it_go(monkeypatch):
    import weakref

    from eval import decode_timing as decode

    made, turns = [], []

    class Session:
        def __init__(self, path):
            self.path = path
            made.append(weakref.ref(self))

    def timed(session, context, new_tokens, shrink):
        turns.append((session.path, sum(ref() is not None for ref in made)))
        return decode.DecodeTimes(1.0, [1.0] * new_tokens)

    monkeypatch.setattr(decode, "make_session", lambda path, threads: Session(path))
    monkeypatch.setattr(decode, "decode_times", timed)
    out = decode.measure_decode(["fp32", "int8", "int4"], np.arange(4), (4,), 2, 3, progress=False)
    assert {held for _, held in turns} == {1}  # one session at a time: the turn before's gone
    assert [path for path, _ in turns] == ["fp32", "int8", "int4"] * 4  # taking turns: a warm-up and 3 rounds
    assert len(made) == 12 and len(out) == 3 and all(row["ctx4"]["per_token_p50_ms"] == 1.0 for row in out)


def test_a_graph_that_fails_to_decode_leaves_the_turns_and_says_why(monkeypatch):
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    from eval import decode_timing as decode

    tried = []

    def timed(session, context, new_tokens, shrink):
        tried.append((session, len(context)))
        if session == "int8" and len(context) == 8:  # its window's cache breaks at the longer context
            raise Fail("Shape mismatch attempting to re-use buffer.\nmore")
        return decode.DecodeTimes(1.0, [1.0] * new_tokens)

    monkeypatch.setattr(decode, "make_session", lambda path, threads: path)
    monkeypatch.setattr(decode, "decode_times", timed)
    out = decode.measure_decode(["fp32", "int8", "int4"], np.arange(4), (4, 8), 2, 3, progress=False)
    said = "decoding after 8 tokens of context failed: Shape mismatch attempting to re-use buffer."
    assert out[1] == {"failed": said}  # its first line
    assert out[0]["ctx8"]["per_token_p50_ms"] == out[2]["ctx8"]["per_token_p50_ms"] == 1.0
    assert tried.count(("int8", 8)) == 1  # not tried again once failed
