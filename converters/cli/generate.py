"""compressor generate GRAPH_OR_FOLDER --prompt TEXT: a causal LM's continuation on ONNX Runtime
(decoding.generate), greedy or sampled with a seed, with the tokenizer of the model folder; with --draft, greedy
and speculative (decoding.speculative)."""

import time
from pathlib import Path

from converters.pipeline.say import say
from decoding.drafts import LOOKUP
from decoding.generate import generate
from decoding.speculative import DRAFT_TOKENS

HELP = "continue a prompt with a causal LM's ONNX graph (greedy, or sampled with a seed)"


def add_arguments(p) -> None:
    p.add_argument("graph", type=Path, help="a model folder (its one graph under onnx/) or an ONNX file")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate at most (default: 32)")
    p.add_argument("--sample", action="store_true", help="sample instead of taking the most likely token")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1.0)")
    p.add_argument("--top-k", type=int, default=50, help="sample among the k most likely tokens (default: 50)")
    p.add_argument("--seed", type=int, default=0, help="the sampling generator's seed (default: 0)")
    p.add_argument("--tokenizer", type=Path, default=None, help="the tokenizer's folder (default: the model folder)")
    p.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads (default: 2)")
    p.add_argument(
        "--draft",
        default=None,
        help=f"speculative greedy decoding, the same text sooner where the draft guesses right: '{LOOKUP}' (the "
        "tokens that followed the last words' latest earlier occurrence in the prompt and the text so far), or a "
        "small causal LM's folder or graph of the same tokenizer; the model checks each guess in one pass",
    )
    p.add_argument(
        "--draft-tokens",
        type=int,
        default=DRAFT_TOKENS,
        help=f"tokens the draft proposes before each pass of the model (default: {DRAFT_TOKENS})",
    )


def run(args) -> None:
    start = time.perf_counter()
    text, tokens, stats = generate(
        args.graph,
        args.prompt,
        args.max_new_tokens,
        args.sample,
        args.temperature,
        args.top_k,
        args.seed,
        args.tokenizer,
        args.threads,
        args.draft,
        args.draft_tokens,
    )
    print(text)
    said = f"{tokens} tokens in {time.perf_counter() - start:.1f} s with loading"
    if stats is not None:
        summary = stats.summary()
        said += (
            f"; the draft's guesses kept {summary['acceptance']:.0%}, {summary['tokens_per_pass']:.2f} tokens a pass "
            f"of the model ({summary['verifier_passes']} passes)"
        )
    say(said)
