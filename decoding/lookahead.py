"""How many proposals to ask of a draft before a verifier pass. A pass of n + 1 tokens costs more than a step on a
CPU, so a draft pays only where it guesses well: the n ≤ k that promise the most tokens per cost at the draft's
recent acceptance, none (a plain step) where no n beats a step."""

import numpy as np

__all__ = ["Lookahead"]

# A pass over n more tokens costs 1 + PASS_GROWTH · n steps, until the Lookahead has timed its own: SmolLM2-135M's
# 4-bit graph at 2 threads (2-core AMD EPYC, avx512_vnni, ONNX Runtime 1.32.0) read 1, 2, 5 and 9 tokens after 128 in
# 3.76, 4.26, 6.81 and 9.93 ms (docs/lab-notes/2026-11-29-speculative-decoding.md).
PASS_GROWTH = 0.2
PRIOR = (1.0, 3.0)  # (kept, proposed): an acceptance of 1/3 before any proposal, and where it returns without any
MEMORY = 0.8  # the weight of the past in the acceptance's running sums, each pass


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
