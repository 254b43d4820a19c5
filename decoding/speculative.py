"""Greedy speculative decoding (Leviathan et al. 2023, Chen et al. 2023) on ONNX Runtime: a draft (decoding.drafts)
proposes up to k tokens, the verifier reads the last accepted token and the proposals in one pass of its cached
graph, and keeps proposals while each equals its own argmax; its argmax after the last kept one comes free. A pass
yields a + 1 tokens (a = proposals kept, 0 ≤ a ≤ k), and a proposal is kept only where the verifier chose it:
the output is the verifier's greedy output as its passes read it. Its cache rolls back what was rejected
(decoding.decoders: `rollback`); a Lookahead says how many proposals to ask for before each pass."""

import time
from dataclasses import dataclass, field

import numpy as np

from decoding.decoders import Decoder, open_decoder
from decoding.lookahead import Lookahead

__all__ = ["DRAFT_TOKENS", "SpeculativeStats", "speculate", "speculative_ids"]

DRAFT_TOKENS = 8  # tokens a draft proposes before each verifier pass, by default


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


def speculate(verifier: Decoder, draft, logits: np.ndarray, want: int, lookahead: Lookahead, eos, on_pass=None):
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
    verifier = open_decoder(verifier_session)
    logits = verifier.start(prompt)
    draft.start(prompt)
    return speculate(verifier, draft, logits, max_new_tokens, Lookahead(k, draft.cost, adaptive), eos)
