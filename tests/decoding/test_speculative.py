"""Speculative decoding (decoding.speculative): several tokens read in one pass give the logits of as many steps, the
cache rolls back, and the output is the verifier's own greedy output whatever the draft proposes (itself, another
random LM, prompt lookup); `generate --draft` end to end with every bad input refused."""

import numpy as np
import pytest

from decoding.decoders import open_decoder
from decoding.drafts import LookupDraft, ModelDraft
from decoding.lookahead import Lookahead
from decoding.sampling import decode_ids
from decoding.speculative import speculative_ids
from eval.graph import make_session
from tests.conftest import run_cli, write_tiny_lm

PROMPTS = ([3, 7, 11], [20, 4, 4, 9, 13, 2], [5])
NEW = 24
GAP = 1e-3  # the least top-2 logit gap of the reference decoding: far above float32 summation order's drift


@pytest.fixture(scope="module", params=["llama", "llama-fused"])
def verifier(request, tiny_llama_dir, tmp_path_factory):
    """The ready folder of a tiny Llama traced by the PyTorch exporter (its presents fed back) and of one
    written as the fused decoder (its cache in buffers bound in place)."""
    from converters.cli import main

    if request.param == "llama":
        source = tiny_llama_dir
    else:
        source = write_tiny_lm(tmp_path_factory.mktemp("fused") / "llama", "llama", hidden=64)
    out = tmp_path_factory.mktemp("verifier") / request.param
    assert main(["export", str(source), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def other_lm(tmp_path_factory):
    """Another random Llama of the same tokenizer, exported: a draft that guesses badly."""
    from converters.cli import main

    source = write_tiny_lm(tmp_path_factory.mktemp("other") / "llama", "llama", seed=5, hidden=64)
    out = tmp_path_factory.mktemp("draft") / "other"
    assert main(["export", str(source), "--out", str(out)]) == 0
    return out


def _session(folder):
    return make_session(folder / "onnx/model.onnx")


def _least_gap(session, prompt, new):
    """The least gap between the two largest logits over the greedy steps that produce `new`."""
    decoder = open_decoder(session)
    logits = [decoder.start(np.array(prompt))] + [decoder.step(t) for t in new[:-1]]
    return min(float(np.diff(np.sort(row)[-2:])[0]) for row in logits)


def test_a_pass_over_several_tokens_gives_each_steps_logits_and_rolls_back(verifier):
    session = _session(verifier)
    stepped, passed = open_decoder(session), open_decoder(session)
    stepped.start(np.arange(5))
    passed.start(np.arange(5))
    tokens = [3, 1, 4, 1, 5]
    steps = np.stack([stepped.step(t) for t in tokens])
    scale = max(float(np.abs(steps).max()), 1.0)
    assert np.abs(passed.extend(tokens) - steps).max() <= 1e-4 * scale
    passed.rollback(7)  # keep 3, 1; read 4, 1 again, then another token where 5 was
    assert np.abs(passed.extend([4, 1]) - steps[2:4]).max() <= 1e-4 * scale
    other = passed.extend([9])[0]
    fresh = open_decoder(session)
    fresh.start(np.array([0, 1, 2, 3, 4, 3, 1, 4, 1]))
    assert np.abs(other - fresh.step(9)).max() <= 1e-4 * scale


@pytest.mark.parametrize("draft", ["itself", "other", "lookup"])
def test_the_output_is_the_verifiers_greedy_output(verifier, other_lm, draft):
    session = _session(verifier)
    proposer = {
        "itself": lambda: ModelDraft(_session(verifier)),
        "other": lambda: ModelDraft(_session(other_lm)),
        "lookup": LookupDraft,
    }[draft]()
    accepted = proposed = 0
    for prompt in PROMPTS:
        greedy = decode_ids(session, np.array(prompt), NEW)
        assert _least_gap(session, prompt, greedy) > GAP  # no near tie that summation order could flip
        for k in (1, 3):
            out, stats = speculative_ids(session, proposer, np.array(prompt), NEW, k, adaptive=False)
            assert out == greedy
            assert sum(stats.pass_tokens) >= NEW - 1 and all(1 <= n <= k + 1 for n in stats.pass_tokens)
            accepted, proposed = accepted + stats.accepted, proposed + stats.proposed
    if draft == "itself":
        assert accepted == proposed  # the same graph's argmax, read one token or several at a time
    if draft == "other":
        assert accepted < proposed  # a bad draft loses passes, not tokens


def test_proposals_stop_where_the_draft_guesses_badly_and_the_output_stays(verifier, other_lm):
    session = _session(verifier)
    prompt = np.array(PROMPTS[1])
    bad = ModelDraft(_session(other_lm), cost=0.0)  # free, so asked for proposals until they fail
    out, stats = speculative_ids(session, bad, prompt, NEW, 3)
    assert out == decode_ids(session, prompt, NEW)
    assert 0 < stats.proposed < 3 * len(stats.pass_tokens)  # tried, then fewer than k a pass
    lookahead = Lookahead(4, cost=0.0)
    for _ in range(8):
        lookahead.update(lookahead.tokens(), 0)
    assert lookahead.tokens() == 0  # every proposal rejected: plain steps
    for _ in range(40):
        lookahead.update(0, 0)
    assert lookahead.tokens() > 0  # and in time tried again
    assert Lookahead(4, cost=0.0, adaptive=False).tokens() == 4


def test_a_pass_not_yet_timed_grows_as_the_timed_one_with_the_most_proposals():
    lookahead = Lookahead(4, cost=0.0)
    lookahead.update(0, 0, pass_seconds=1.0)  # a plain step: 1 s
    lookahead.update(1, 1, pass_seconds=1.5)  # a pass of one proposal: 1.5 steps, its proposal kept
    np.testing.assert_allclose(lookahead._costs(), [1.0, 1.5, 2.0, 2.5, 3.0], rtol=1e-12)
    assert lookahead.tokens() == 1  # α = 1.8 / 3.4: E(1) / C(1) = 1.02 beats E(2) / C(2) = 0.90 and a step


def test_it_stops_after_the_end_of_text_token(verifier):
    session = _session(verifier)
    greedy = decode_ids(session, np.array(PROMPTS[1]), NEW)
    eos = greedy[len(greedy) // 2]
    expected = decode_ids(session, np.array(PROMPTS[1]), NEW, eos=eos)
    out, _ = speculative_ids(session, ModelDraft(_session(verifier)), np.array(PROMPTS[1]), NEW, 3, eos=eos)
    assert out == expected and out[-1] == eos


def test_lookup_proposes_what_followed_the_latest_match():
    lookup = LookupDraft(ngram=2, least=1)
    assert lookup.propose(np.array([1, 2, 3, 9, 1, 2, 4, 5, 1, 2]), 3) == [4, 5, 1]  # the latest (1, 2)
    assert lookup.propose(np.array([7, 8, 3, 9, 8]), 5) == [3, 9, 8, 3, 9]  # 8 alone matched; then its loop of 3
    assert lookup.propose(np.array([5, 6, 7, 6, 7]), 5) == [6, 7, 6, 7, 6]  # (6, 7) two back: a loop of 2
    assert lookup.propose(np.array([1, 2, 3]), 2) == []
    assert LookupDraft(ngram=3, least=2).propose(np.array([7, 8, 3, 9, 8]), 4) == []  # 8 alone is too short


def test_generate_with_a_draft_prints_what_generate_prints(verifier, other_lm, capsys):
    argv = ("generate", verifier, "--prompt", "the value of", "--max-new-tokens", 12)
    code, plain, err = run_cli(capsys, *argv)
    assert code == 0, err
    for draft in ("lookup", other_lm):
        code, drafted, err = run_cli(capsys, *argv, "--draft", draft, "--draft-tokens", 3)
        assert code == 0 and drafted == plain, err
        assert " tokens in " in err and "the draft's guesses kept" in err and "tokens a pass of the model" in err


@pytest.fixture(scope="module")
def bad_drafts(other_lm, tiny_bert_dir, tmp_path_factory) -> dict:
    """Folders a draft cannot be: an encoder's, a Llama scoring 8 tokens more, one whose tokenizer has a token
    more (the same graph as other_lm), a path that is not there."""
    import shutil

    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    from converters.cli import main

    root = tmp_path_factory.mktemp("bad")
    assert main(["export", str(tiny_bert_dir), "--out", str(root / "encoder")]) == 0
    wide = write_tiny_lm(root / "wide-src", "llama", hidden=64)
    model = LlamaForCausalLM.from_pretrained(wide)
    model.resize_token_embeddings(model.config.vocab_size + 8)
    model.save_pretrained(wide)
    assert main(["export", str(wide), "--out", str(root / "wide")]) == 0
    shutil.copytree(other_lm, root / "renamed")
    renamed = PreTrainedTokenizerFast.from_pretrained(other_lm)
    renamed.add_tokens(["zebra-token"])
    renamed.save_pretrained(root / "renamed")
    return {"encoder": root / "encoder", "wide": root / "wide", "renamed": root / "renamed", "missing": root / "gone"}


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (("--draft", "lookup", "--draft-tokens", 0), "at least 1"),
        (("--draft", "lookup", "--sample"), "greedy decoding only"),
        (("--draft", "{encoder}"), "a draft is a causal LM"),
        (("--draft", "{wide}"), "the draft scores"),
        (("--draft", "{renamed}"), "is not the model's"),
        (("--draft", "{missing}"), "gone"),
    ],
)
def test_bad_draft_input_is_one_sentence(verifier, bad_drafts, capsys, extra, said):
    extra = [str(e).format(**bad_drafts) for e in extra]
    code, _, err = run_cli(capsys, "generate", verifier, "--prompt", "the cat", *extra)
    assert code == 2 and said in err, err
