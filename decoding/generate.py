"""A prompt's continuation by a causal LM graph on ONNX Runtime, as `compressor generate` prints it: greedy or
sampled with a seed (decoding.sampling), or greedy with a draft proposing tokens that the graph checks in one pass
(decoding.speculative), every input checked before a session is made."""

from pathlib import Path

import numpy as np

from compressor.errors import CompressorError
from decoding.context import context_length
from decoding.drafts import open_draft
from decoding.sampling import decode_ids
from decoding.speculative import DRAFT_TOKENS, SpeculativeStats, speculative_ids
from eval.graph import make_session
from eval.kinds import CAUSAL_LM, graph_kind
from files.model_folder import folder_of, graph_in, lacks_tokenizer

__all__ = ["generate"]


def generate(
    path: str | Path,
    prompt: str,
    max_new_tokens: int = 32,
    sample: bool = False,
    temperature: float = 1.0,
    top_k: int = 50,
    seed: int = 0,
    tokenizer: str | Path | None = None,
    threads: int = 2,
    draft: str | Path | None = None,
    draft_tokens: int = DRAFT_TOKENS,
) -> tuple[str, int, SpeculativeStats | None]:
    """(the prompt and its continuation, the tokens generated, what the draft did or None) by the causal LM
    graph at `path` (a model folder, or an ONNX file whose folder holds the tokenizer unless `tokenizer` names
    one), decoded on ONNX Runtime; with `draft` (a draft LM's folder or graph, or "lookup"), greedy and
    speculative, at most `draft_tokens` proposed a pass."""
    if max_new_tokens < 1:
        raise CompressorError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if sample and not (temperature > 0 and top_k >= 1):
        raise CompressorError(f"sampling needs a temperature > 0 and a top-k ≥ 1, got {temperature:g} and {top_k}")
    if sample and draft is not None:
        raise CompressorError("a draft speeds up greedy decoding only: leave out --sample or --draft")
    graph = graph_in(path)
    kind = graph_kind(graph)
    if kind is not CAUSAL_LM:
        raise CompressorError(f"{str(graph)!r} is a graph of the {kind.name} kind; generate takes a causal LM's")
    folder = Path(tokenizer) if tokenizer is not None else folder_of(graph)
    if lacks_tokenizer(folder):
        raise CompressorError(f"no tokenizer in {str(folder)!r}: give --tokenizer the model's folder")
    from texts.tokens import load_tokenizer

    tok = load_tokenizer(folder)
    proposer = None if draft is None else open_draft(draft, graph, tok, draft_tokens, threads)
    ids = tok(prompt)["input_ids"]
    if not ids:
        raise CompressorError("the prompt has no tokens")
    limit = context_length(folder_of(graph))
    if limit is not None and len(ids) + max_new_tokens > limit:
        raise CompressorError(
            f"the prompt's {len(ids)} tokens and {max_new_tokens} new ones exceed the model's context of {limit}"
        )
    session = make_session(graph, threads=threads)
    eos = tok.eos_token_id if isinstance(tok.eos_token_id, int) else None
    stats = None
    if proposer is None:
        new = decode_ids(session, np.array(ids), max_new_tokens, eos, sample, temperature, top_k, seed)
    else:
        new, stats = speculative_ids(session, proposer, np.array(ids), max_new_tokens, draft_tokens, eos)
    return tok.decode(ids + new, skip_special_tokens=True), len(new), stats
