"""Greedy speculative decoding (Leviathan et al. 2023, Chen et al. 2023) on ONNX Runtime: a draft proposes up
to k tokens, the verifier reads the last accepted token and the proposals in one pass of its cached graph,
and keeps proposals while each equals its own argmax; its argmax after the last kept one comes free. A pass
yields a + 1 tokens (a = proposals kept, 0 ≤ a ≤ k), and a proposal is kept only where the verifier chose it:
the output is the verifier's greedy output as its passes read it. Its cache rolls back what was rejected
(eval.decode.Decoder.rollback). Two drafts:

- ModelDraft: a small causal LM of the same vocabulary, greedy, k steps of its own cached graph;
- LookupDraft (prompt lookup decoding, Saxena 2023): the tokens that followed the latest earlier occurrence
  of the sequence's last n tokens (n from `ngram` down to 1), free; nothing when there is none, and the pass
  is a plain step.

A pass of k + 1 tokens costs more than a step on a CPU (ONNX Runtime's 4-bit MatMul at 2 threads: 1.8× at
k = 4), so a draft pays when a + 1 exceeds that factor plus what its proposals cost."""

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from compressor.errors import CompressorError
from eval.decode import Decoder, DecodeTimes
from eval.graph import load_graph, make_session
from eval.kinds import CAUSAL_LM, graph_kind
from files.model_folder import folder_of, graph_in, lacks_tokenizer

__all__ = [
    "DRAFT_TOKENS",
    "LOOKUP",
    "LookupDraft",
    "ModelDraft",
    "SpeculativeStats",
    "open_draft",
    "speculative_ids",
    "speculative_times",
]

DRAFT_TOKENS = 4  # tokens a draft proposes before each verifier pass, by default
LOOKUP = "lookup"  # the name that asks for a LookupDraft where a draft folder goes
LOOKUP_NGRAM = 3  # the longest tail a LookupDraft matches


class ModelDraft:
    """A draft LM's session: it reads what the verifier accepted (rolled back to where they part) and
    proposes its greedy tokens."""

    def __init__(self, session):
        self.decoder = Decoder(session)

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
    """Prompt lookup: the k tokens after the latest earlier occurrence of the last n ≤ `ngram` ids."""

    def __init__(self, ngram: int = LOOKUP_NGRAM):
        self.ngram = ngram

    def start(self, prompt: np.ndarray) -> None:
        pass

    def propose(self, ids: np.ndarray, k: int) -> list[int]:
        for n in range(min(self.ngram, len(ids) - 1), 0, -1):
            tail = ids[-n:]
            starts = np.flatnonzero(np.all(np.lib.stride_tricks.sliding_window_view(ids[:-1], n) == tail, axis=1))
            if len(starts):
                after = starts[-1] + n
                return [int(t) for t in ids[after : after + k]]
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
    # the threads sleep between runs: the draft's would otherwise spin on the cores the verifier runs on
    return ModelDraft(make_session(graph, threads=threads, spin=False))


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


def _decode(verifier: Decoder, draft, logits: np.ndarray, want: int, k: int, eos, on_pass=None):
    """After the verifier read the prompt (its next logits `logits`): up to `want` new tokens, stopping after
    `eos`, and the stats; `on_pass(tokens)` after each verifier pass."""
    stats = SpeculativeStats()
    new = [int(np.argmax(logits))]
    while len(new) < want and eos not in new:
        length = verifier.ids.shape[1]
        proposals = draft.propose(np.append(verifier.ids[0], new[-1]), min(k, want - len(new)))
        checked = np.argmax(verifier.extend([new[-1], *proposals]), axis=1)
        kept = next((j for j, (p, c) in enumerate(zip(proposals, checked)) if p != c), len(proposals))
        yielded = [*proposals[:kept], int(checked[kept])]
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
    verifier_session, draft, prompt: np.ndarray, max_new_tokens: int, k: int = DRAFT_TOKENS, eos=None
) -> tuple[list[int], SpeculativeStats]:
    """The verifier's greedy new token ids after `prompt` (1-D ids), `draft` (a ModelDraft or LookupDraft)
    proposing up to `k` at a time; stops after `eos`. Also the stats of the decoding."""
    verifier = Decoder(verifier_session)
    logits = verifier.start(prompt)
    draft.start(prompt)
    return _decode(verifier, draft, logits, max_new_tokens, k, eos)


def speculative_times(
    verifier_session, draft, context: np.ndarray, new_tokens: int, k: int = DRAFT_TOKENS
) -> tuple[DecodeTimes, SpeculativeStats]:
    """The prefill of `context` by the verifier and the draft, and `new_tokens` tokens after it: a verifier
    pass of t ms (the draft's proposals before it included) yielding n tokens counts n steps of t / n ms."""
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

    _, stats = _decode(verifier, draft, logits, new_tokens + 1, k, None, timed)
    return DecodeTimes(prefill, steps[:new_tokens]), stats
