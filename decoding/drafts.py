"""The drafts that propose tokens for speculative decoding (decoding.speculative) to check, each with `start(prompt)`,
`propose(ids, k)` and `cost` (a proposal's time in the verifier's steps):

- ModelDraft: a small causal LM of the same vocabulary, greedy, k steps of its own cached graph;
- LookupDraft (prompt lookup decoding, Saxena 2023): the tokens that followed the latest earlier occurrence
  of the sequence's last n tokens (n from `ngram` down to `least`), free; nothing when there is none, and the
  pass is a plain step."""

import json
from pathlib import Path

import numpy as np

from compressor.errors import CompressorError
from decoding.decoders import open_decoder
from eval.graph import initializer_stats, load_graph, make_session
from eval.kinds import CAUSAL_LM, graph_kind
from files.model_folder import folder_of, graph_in, lacks_tokenizer

__all__ = ["LOOKUP", "LookupDraft", "ModelDraft", "open_draft"]

LOOKUP = "lookup"  # the name that asks for a LookupDraft where a draft folder goes
LOOKUP_NGRAM, LOOKUP_LEAST = 3, 2  # the longest and the shortest tail a LookupDraft matches


class ModelDraft:
    """A draft LM's session: it reads what the verifier accepted (rolled back to where they part) and
    proposes its greedy tokens; `cost`: a proposal's time in the verifier's steps (its weights' bytes over the
    verifier's: at batch 1 a step reads every weight once)."""

    def __init__(self, session, cost: float = 1.0):
        self.decoder = open_decoder(session)
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
