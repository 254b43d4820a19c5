"""Greedy speculative decoding (Leviathan et al. 2023, Chen et al. 2023) on ONNX Runtime: a draft proposes up
to k tokens, the verifier reads the last accepted token and the proposals in one pass of its cached graph,
and keeps proposals while each equals its own argmax; its argmax after the last kept one comes free. A pass
yields a + 1 tokens (a = proposals kept, 0 ≤ a ≤ k), and a proposal is kept only where the verifier chose it:
the output is the verifier's greedy output as its passes read it. Its cache rolls back what was rejected
(eval.decode.Decoder.rollback). Two drafts:

- ModelDraft: a small causal LM of the same vocabulary, greedy, k steps of its own cached graph;
- LookupDraft (prompt lookup decoding, Saxena 2023): the tokens that followed the latest earlier occurrence
  of the sequence's last n tokens (n from `ngram` down to `least`), free; nothing when there is none, and the
  pass is a plain step.

A pass of n + 1 tokens costs more than a step on a CPU, so a draft pays only where it guesses well: before each
pass a Lookahead asks for the n ≤ k proposals that promise the most tokens per cost at the draft's recent
acceptance, none (a plain step) where no n beats a step."""

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from compressor.errors import CompressorError
from eval.decode import Decoder, DecodeTimes
from eval.graph import initializer_stats, load_graph, make_session
from eval.kinds import CAUSAL_LM, graph_kind
from files.model_folder import folder_of, graph_in, lacks_tokenizer

__all__ = [
    "DRAFT_TOKENS",
    "LOOKUP",
    "Lookahead",
    "LookupDraft",
    "ModelDraft",
    "SpeculativeStats",
    "open_draft",
    "speculative_ids",
    "speculative_times",
]

DRAFT_TOKENS = 8  # tokens a draft proposes before each verifier pass, by default
LOOKUP = "lookup"  # the name that asks for a LookupDraft where a draft folder goes
LOOKUP_NGRAM, LOOKUP_LEAST = 3, 2  # the longest and the shortest tail a LookupDraft matches
# A pass over n more tokens costs 1 + PASS_GROWTH · n steps, until the Lookahead has timed its own: SmolLM2-135M's
# 4-bit graph at 2 threads (2-core AMD EPYC, avx512_vnni, ONNX Runtime 1.32.0) read 1, 2, 5 and 9 tokens after 128 in
# 3.76, 4.26, 6.81 and 9.93 ms (docs/lab-notes/2026-11-29-speculative-decoding.md).
PASS_GROWTH = 0.2
PRIOR = (1.0, 3.0)  # (kept, proposed): an acceptance of 1/3 before any proposal, and where it returns without any
MEMORY = 0.8  # the weight of the past in the acceptance's running sums, each pass


class ModelDraft:
    """A draft LM's session: it reads what the verifier accepted (rolled back to where they part) and
    proposes its greedy tokens; `cost`: a proposal's time in the verifier's steps (its weights' bytes over the
    verifier's: at batch 1 a step reads every weight once)."""

    def __init__(self, session, cost: float = 1.0):
        self.decoder = Decoder(session)
        self.cost = cost

    def start(self, prompt: np.ndarray) -> None:
        self.decoder.start(prompt)

    def propose(self, ids: np.ndarray, k: int) -> list[int]:
        held = self.decoder.ids[0]
        same = min(len(held), len(ids) - 1)  # at least the last token is new to the draft
        same = next((i for i in range(same) if held[i] != ids[i]), same)
        self.decoder.rollback(same)
        proposals = [int(np.argmax(self.decoder.extend(ids[same:])[-1]))]
        while len(proposals) < k:
            proposals.append(int(np.argmax(self.decoder.step(proposals[-1]))))
        return proposals


class LookupDraft:
    """Prompt lookup: the k tokens after the latest earlier occurrence of the last n ids, `least` ≤ n ≤ `ngram`
    (a single token matches too often to guess well: at context 2,048 its passes cost more than they gave)."""

    cost = 0.0  # a search of the ids: nothing beside a pass

    def __init__(self, ngram: int = LOOKUP_NGRAM, least: int = LOOKUP_LEAST):
        self.ngram, self.least = ngram, least

    def start(self, prompt: np.ndarray) -> None:
        pass

    def propose(self, ids: np.ndarray, k: int) -> list[int]:
        """The k tokens that followed the latest match, the text taken to repeat with the match's shift p past
        its end too (a loop of p tokens proposes k, not the p − n that follow the match)."""
        for n in range(min(self.ngram, len(ids) - 1), self.least - 1, -1):
            tail = ids[-n:]
            starts = np.flatnonzero(np.all(np.lib.stride_tricks.sliding_window_view(ids[:-1], n) == tail, axis=1))
            if len(starts):
                shift = len(ids) - n - starts[-1]
                out = [int(t) for t in ids[len(ids) - shift : len(ids) - shift + k]]
                while len(out) < k:
                    out.append(out[len(out) - shift])
                return out
        return []


def _vocabulary(graph: Path) -> int | None:
    """The tokens the graph scores: its logits' last dimension where it declares it, else its folder's
    config.json `vocab_size`; None when neither says."""
    logits = next(o for o in load_graph(graph, with_data=False).graph.output if o.name == "logits")
    last = logits.type.tensor_type.shape.dim[-1]
    if last.HasField("dim_value"):
        return last.dim_value
    try:
        return int(json.loads((folder_of(graph) / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def open_draft(draft: str | Path, verifier: Path, tokenizer, k: int, threads: int = 2):
    """The draft `draft` names for the causal LM graph `verifier` whose tokenizer is `tokenizer`: "lookup", or a
    draft LM's folder or graph, checked to be a causal LM of the same vocabulary (its graph's logits, its
    tokenizer's tokens) before its session is made; `k` (proposals a pass) ≥ 1."""
    if k < 1:
        raise CompressorError(f"--draft-tokens must be at least 1, got {k}")
    if str(draft) == LOOKUP:
        return LookupDraft()
    graph = graph_in(Path(draft))
    kind = graph_kind(graph)
    if kind is not CAUSAL_LM:
        raise CompressorError(f"the draft {str(graph)!r} is a graph of the {kind.name} kind; a draft is a causal LM")
    ours, theirs = _vocabulary(verifier), _vocabulary(graph)
    if None not in (ours, theirs) and ours != theirs:
        raise CompressorError(f"the draft scores {theirs} tokens and the model {ours}: a draft shares its vocabulary")
    if not lacks_tokenizer(folder_of(graph)):
        from texts.tokens import load_tokenizer

        if load_tokenizer(folder_of(graph)).get_vocab() != tokenizer.get_vocab():
            raise CompressorError(
                f"the draft's tokenizer in {str(folder_of(graph))!r} is not the model's: a draft shares its vocabulary"
            )
    weights = [initializer_stats(load_graph(g, with_data=False))[1] for g in (graph, verifier)]
    cost = weights[0] / weights[1]
    # the threads sleep between runs: the draft's would otherwise spin on the cores the verifier runs on
    return ModelDraft(make_session(graph, threads=threads, spin=False), cost)


class Lookahead:
    """How many proposals to ask of a draft before a pass: the n ≤ k that maximises E(n) / C(n), E(n) = Σ_{i ≤ n}
    α^i the tokens a pass yields when each proposal is kept with probability α (the draft's recent acceptance),
    C(n) the pass's time and the draft's for n proposals; 0 where no n beats a plain step. The times are the
    decoding's own, as they are measured (a pass's cost grows with the context: at 2,048 its second token alone
    costs 0.39 of a step, 0.48 with an int8 cache, with which each more token costs about a step's attention), a
    pass not yet timed as the timed one with the most proposals grows; before any is, C(n) = 1 + (PASS_GROWTH +
    the draft's cost) · n steps. α's running sums forget the past by MEMORY a pass, and without proposals drift back
    to PRIOR, so a draft that failed is tried again. `adaptive` False: always k."""

    def __init__(self, k: int, cost: float, adaptive: bool = True):
        self.k, self.cost, self.adaptive = k, cost, adaptive
        self.kept, self.proposed = PRIOR
        self.pass_seconds: dict[int, float] = {}  # proposals read → the running mean of such a pass's time
        self.draft_seconds: float | None = None  # the running mean of a proposal's time

    def _costs(self) -> np.ndarray:
        """C(n) for n = 0 … k, in steps."""
        n = np.arange(self.k + 1)
        if not self.pass_seconds:
            return 1 + (PASS_GROWTH + self.cost) * n
        step = self.pass_seconds.get(0) or min(t / (1 + PASS_GROWTH * m) for m, t in self.pass_seconds.items())
        most = max(self.pass_seconds)  # the pass timed with the most proposals sets the growth of those not timed
        growth = max(self.pass_seconds[most] / step - 1, 0.0) / most if most else PASS_GROWTH
        passes = np.array([self.pass_seconds.get(m, step * (1 + growth * m)) for m in n])
        draft = self.cost * step if self.draft_seconds is None else self.draft_seconds
        return (passes + draft * n) / step

    def tokens(self) -> int:
        if not self.adaptive:
            return self.k
        alpha = self.kept / self.proposed
        expected = np.cumsum(alpha ** np.arange(self.k + 1))
        return int(np.argmax(expected / self._costs()))

    def update(self, proposed: int, kept: int, pass_seconds: float | None = None, draft_seconds: float = 0.0) -> None:
        """After a pass that kept `kept` of `proposed` (proposals after the first rejected one were never judged:
        the trials are the kept ones and that one), the pass taking `pass_seconds` and the proposals
        `draft_seconds`."""
        if pass_seconds is not None:
            held = self.pass_seconds.get(proposed, pass_seconds)
            self.pass_seconds[proposed] = MEMORY * held + (1 - MEMORY) * pass_seconds
        if proposed:
            each = draft_seconds / proposed
            held = each if self.draft_seconds is None else self.draft_seconds
            self.draft_seconds = MEMORY * held + (1 - MEMORY) * each
        tried = kept + (kept < proposed)
        if not proposed:
            kept, tried = ((1 - MEMORY) * p for p in PRIOR)  # drift back toward the prior
        self.kept = MEMORY * self.kept + kept
        self.proposed = MEMORY * self.proposed + tried


@dataclass
class SpeculativeStats:
    """What a speculative decoding did: its verifier passes, the draft's proposals and those kept."""

    proposed: int = 0
    accepted: int = 0
    pass_tokens: list[int] = field(default_factory=list)  # tokens each verifier pass yielded

    def add(self, other: "SpeculativeStats") -> None:
        self.proposed += other.proposed
        self.accepted += other.accepted
        self.pass_tokens += other.pass_tokens

    def summary(self) -> dict:
        return {
            "acceptance": round(self.accepted / max(self.proposed, 1), 4),
            "tokens_per_pass": round(float(np.mean(self.pass_tokens)) if self.pass_tokens else 0.0, 3),
            "verifier_passes": len(self.pass_tokens),
        }


def _decode(verifier: Decoder, draft, logits: np.ndarray, want: int, lookahead: Lookahead, eos, on_pass=None):
    """After the verifier read the prompt (its next logits `logits`): up to `want` new tokens, stopping after
    `eos`, and the stats; `on_pass(tokens)` after each verifier pass."""
    stats = SpeculativeStats()
    new = [int(np.argmax(logits))]
    while len(new) < want and eos not in new:
        length = verifier.ids.shape[1]
        asked = min(lookahead.tokens(), want - len(new))
        start = time.perf_counter()
        proposals = draft.propose(np.append(verifier.ids[0], new[-1]), asked) if asked else []
        drafted = time.perf_counter()
        checked = np.argmax(verifier.extend([new[-1], *proposals]), axis=1)
        kept = next((j for j, (p, c) in enumerate(zip(proposals, checked)) if p != c), len(proposals))
        yielded = [*proposals[:kept], int(checked[kept])]
        lookahead.update(len(proposals), kept, time.perf_counter() - drafted, drafted - start)
        stats.proposed += len(proposals)
        stats.accepted += kept
        stats.pass_tokens.append(len(yielded))
        verifier.rollback(length + 1 + kept)  # the last token and the kept proposals
        new += yielded
        if on_pass is not None:
            on_pass(len(yielded))
    if eos in new:
        new = new[: new.index(eos) + 1]
    return new[:want], stats


def speculative_ids(
    verifier_session,
    draft,
    prompt: np.ndarray,
    max_new_tokens: int,
    k: int = DRAFT_TOKENS,
    eos=None,
    adaptive: bool = True,
) -> tuple[list[int], SpeculativeStats]:
    """The verifier's greedy new token ids after `prompt` (1-D ids), `draft` (a ModelDraft or LookupDraft)
    proposing up to `k` at a time (as many as a Lookahead asks; `adaptive` False: k); stops after `eos`. Also
    the stats of the decoding."""
    verifier = Decoder(verifier_session)
    logits = verifier.start(prompt)
    draft.start(prompt)
    return _decode(verifier, draft, logits, max_new_tokens, Lookahead(k, draft.cost, adaptive), eos)


def speculative_times(
    verifier_session, draft, context: np.ndarray, new_tokens: int, k: int = DRAFT_TOKENS, adaptive: bool = True
) -> tuple[DecodeTimes, SpeculativeStats]:
    """The prefill of `context` by the verifier and the draft, and `new_tokens` tokens after it: a verifier
    pass of t ms (the draft's proposals before it included) yielding n tokens counts n steps of t / n ms;
    `adaptive` False: k proposals a pass (what the draft guesses, whatever it costs)."""
    verifier = Decoder(verifier_session)
    start = time.perf_counter()
    logits = verifier.start(context)
    draft.start(context)
    prefill = (time.perf_counter() - start) * 1e3
    steps: list[float] = []
    clock = [time.perf_counter()]

    def timed(tokens: int) -> None:
        now = time.perf_counter()
        steps.extend([(now - clock[0]) * 1e3 / tokens] * tokens)
        clock[0] = now

    _, stats = _decode(verifier, draft, logits, new_tokens + 1, Lookahead(k, draft.cost, adaptive), None, timed)
    return DecodeTimes(prefill, steps[:new_tokens]), stats
