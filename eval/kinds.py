"""What eval knows of a model kind, recognised from an ONNX graph's inputs and outputs alone (eval
does not import converters): the graph's contract, what quality compares, its metrics, and the
default texts. An encoder: (input_ids, attention_mask) → last_hidden_state, compared by its sentence embeddings
(cosine to the original, neighbour recall@10): those its sentence-transformers folder's modules compute (Pooling,
Dense, Normalize: eval.embedding), mean-pooled for a folder without them. A causal language model:
(input_ids, attention_mask) → logits, with or without a key-value cache (measured as a prefill: the
pasts empty), compared by next-token predictions (perplexity, top-1
agreement with the original, mean KL(original ‖ variant))."""

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from compressor.errors import CompressorError
from eval.embedding import sentence_embedding
from eval.graph import load_graph
from eval.probe import PAST
from eval.quality import NextTokens, cosine_mean, mean_pool, next_token_quality, next_tokens, recall_at_k
from files.sentence_modules import SentenceModules, sentence_modules
from texts.corpus import HELD_OUT, lm_passages, passages

__all__ = ["GraphKind", "ENCODER", "CAUSAL_LM", "GRAPH_KINDS", "graph_kind"]


@dataclass(frozen=True)
class GraphKind:
    """A kind as eval sees it. `represent(session, batches, reference)` gives what quality compares
    between a variant and the original (`reference`: what the original gave, None for the original
    itself); `quality(reference, other)` the metrics; `loss(reference, other)` one number to minimise
    (how far the other is); `min_passages` how many eval passages the metrics need; `front` the
    quality key the Pareto fronts maximise; `parity_atol` the most an export's output may differ from
    PyTorch's."""

    name: str
    inputs: tuple[str, ...]
    output: str
    min_passages: int
    front: str
    parity_atol: float = 1e-4
    parity_relative: bool = False  # parity_atol times the output's largest |value| (converters.export.parity_of)
    gate_tol: float | None = None  # a quantized graph's most relative error (of `gated`); None: by width
    int8_per_channel: bool = True  # int8 weights scaled per output channel (else per tensor)
    # How the 8-bit factors of int4-corrected's corrections are stored (correction.FACTOR_FORMS): "int8",
    # ONNX Runtime's dynamic int8 MatMul, fastest for a short input and a long batch alike; "nbits",
    # MatMulNBits at accuracy level 4, for an LM's decode step of one token, whose activations' outliers one
    # scale a tensor would not hold (BENCHMARKS.md, "The corrections' factors as dynamic int8";
    # "int4-corrected on SmolLM2 again")
    factor_form: str = "int8"
    # Passages of the calibration text the aware schemes read (their maxima grow with the text: on
    # all-MiniLM-L6-v2, 256 pydoc passages gave recall@10 0.936, all 292 0.943), and the gate's batches of them
    calibration_passages: int = 1024
    gate_batches: int = 4
    # Whether its graphs are timed at the (batch, sequence, threads) of eval.latency (else by what its users run)
    shape_latency: bool = True
    # Tokens its memory probe decodes one at a time after a prompt read at batch 1 (eval.probe.decoded); 0: its peak
    # RSS is a batch's (the bench's rss_shape) read at once
    memory_decode: int = 0
    # The held-out passages its quality reads by default, times the model's parameters (None: every passage): each
    # row's forward passes over them cost as much at any size (held_out_count)
    quality_parameter_passages: float | None = None

    def held_out_count(self, available: int, parameters: int | None) -> int:
        """How many of `available` held-out passages the quality reads by default for a model of `parameters`:
        all of them, or the budget's share (at least one batch of 32 and `min_passages`)."""
        if self.quality_parameter_passages is None or not parameters:
            return available
        return min(available, max(32, self.min_passages, int(self.quality_parameter_passages // parameters)))

    def recognises(self, inputs: list[str], outputs: list[str]) -> bool:
        return sorted(inputs) == sorted(self.inputs) and self.output in outputs

    def in_folder(self, folder: str | Path) -> "GraphKind":
        """This kind as it measures the graphs of the model folder `folder` (its tokenizer's): itself."""
        return self

    def gated(self, output: np.ndarray) -> np.ndarray:
        """What a quantized graph's gate compares of the output at real positions (…, width): as it is."""
        return output

    def passages(self, path: str | Path | None, split: str, minimum: int = 1) -> tuple[list[str], str]:
        """(passages, where from): a user's file, else this kind's default text split; at least
        `minimum` of them, and for a held-out text (eval, second) at least what the metrics need."""
        return passages(path, split, max(minimum, self.min_passages if split in HELD_OUT else 1))


@dataclass(frozen=True)
class EncoderGraphKind(GraphKind):
    # The sentence-transformers modules that follow the graph (None: mean pooling, as a folder without them pools)
    modules: SentenceModules | None = field(default=None, compare=False, repr=False)

    def in_folder(self, folder: str | Path) -> "EncoderGraphKind":
        """This kind with the modules of the sentence-transformers folder `folder`, where they do more than pool by
        the mean and normalise (what it does without them: all-MiniLM-L6-v2's Pooling and Normalize)."""
        modules = sentence_modules(Path(folder))
        if modules is None or (modules.pooling == ("mean",) and not modules.dense):
            return self
        return replace(self, modules=modules)

    def represent(self, session, batches, reference=None) -> np.ndarray:
        """The sentence embeddings, L2-normalised: (N, D): the modules' (eval.embedding), else the mean of
        last_hidden_state over the real tokens; the normalisation is cosine's, which a Normalize module leaves."""
        out = []
        for feed in batches:
            (hidden,) = session.run([self.output], feed)  # (B, T, H)
            mask = feed["attention_mask"]
            out.append(
                mean_pool(hidden, mask) if self.modules is None else sentence_embedding(hidden, mask, self.modules)
            )
        emb = np.concatenate(out)
        return emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)

    def loss(self, reference: np.ndarray, other: np.ndarray) -> float:
        """1 − the mean cosine of the sentence embeddings (unit rows), as ½‖a − b‖² without cancellation."""
        return float(0.5 * np.mean(np.sum((reference.astype(np.float64) - other) ** 2, axis=1)))

    def quality(self, reference: np.ndarray, other: np.ndarray) -> dict[str, float]:
        return {
            "cosine_mean": round(cosine_mean(reference, other), 4),
            "recall_at_10": round(recall_at_k(reference, other, 10), 4),
        }


class CausalLMGraphKind(GraphKind):
    def recognises(self, inputs: list[str], outputs: list[str]) -> bool:
        """(input_ids, attention_mask) → logits, with or without a key-value cache (eval.probe.PAST)."""
        extra = set(inputs) - set(self.inputs)
        cache = all(n == "position_ids" or n.startswith(PAST) for n in extra)
        return set(self.inputs) <= set(inputs) and cache and self.output in outputs

    def passages(self, path: str | Path | None, split: str, minimum: int = 1) -> tuple[list[str], str]:
        """A user's file, else the default text's split as a language model sees it (texts.corpus.lm_passages:
        the fine-tune split is the quarter of the default one that the project's own LMs never trained on)."""
        if path is not None or split != "finetune":
            return super().passages(path, split, minimum)
        texts = lm_passages(split)
        where = "the default text's finetune split, the quarter no LM of tools/train_lm.py saw"
        return texts, f"{where} ({len(texts)} passages)"

    def gated(self, output: np.ndarray) -> np.ndarray:
        """The next-token probabilities: on SmolLM2 (2 calibration batches) a broken int8 graph (per-channel,
        KL 11 nats) is 1.44 off in relative L2, the working per-tensor int8 0.63 (KL 0.91), int4 0.48 (KL
        0.51). The logits' and the log-probabilities' errors are dominated by the many unlikely tokens and
        do not tell them apart (log-probabilities: 0.28 broken, 0.13 working)."""
        shifted = np.exp(output.astype(np.float64) - output.max(axis=-1, keepdims=True))
        return shifted / shifted.sum(axis=-1, keepdims=True)

    def represent(self, session, batches, reference: NextTokens | None = None) -> NextTokens:
        """Each real next-token prediction's log-probability of the true token, argmax, and its
        distribution over the reference's most likely tokens (eval.quality.next_tokens)."""
        return next_tokens(session, self.output, batches, reference)

    def loss(self, reference: NextTokens, other: NextTokens) -> float:
        """The mean KL(reference ‖ other) over the predictions."""
        return next_token_quality(reference, other)["kl_mean"]

    def quality(self, reference: NextTokens, other: NextTokens) -> dict[str, float]:
        return {k: round(v, 4) for k, v in next_token_quality(reference, other).items()}


INPUTS = ("input_ids", "attention_mask")
# An encoder's hidden states grow with its depth (a 24-layer Gemma 3's reach hundreds): its parity is relative
ENCODER = EncoderGraphKind(
    "encoder", INPUTS, "last_hidden_state", min_passages=11, front="recall_at_10", parity_relative=True
)
# Logits of a 30-layer LM (SmolLM2, |logit| up to ~30) differ between ONNX Runtime and PyTorch in fp32 from the
# order of summation alone: 1.3e-4 for the original, 1.6e-2 with its table compressed 8× (whose fp32 PyTorch
# logits differ from its own fp64 ones by 7.4e-3). 5e-2 is 2e-3 of their range; a wrong row is off by ~1.
# ONNX Runtime's per-channel dynamic int8 breaks SmolLM2's graph (perplexity 34 → 2·10⁶); per tensor: 34 → 77.
CAUSAL_LM = CausalLMGraphKind(
    "causal-lm",
    INPUTS,
    "logits",
    min_passages=1,
    front="top1_agreement",
    parity_atol=5e-2,
    gate_tol=1.0,
    int8_per_channel=False,
    factor_form="nbits",
    # An LM's batches are 32 passages of up to 128 tokens whose logits are 49,152 (SmolLM2) to 152 k (Qwen2.5) wide:
    # each forward pass is ~1 GFLOP a token. 256 passages (33 k tokens: AWQ's calibration reads 128 × 512) made
    # int4-aware's ranges on SmolLM2 in a quarter of the 12 minutes 1,024 took; one batch gates (4 k predictions)
    calibration_passages=256,
    gate_batches=1,
    # Its time is what its users run, a prefill and each generated token (eval.decode_timing, at batch 1); the encoder's
    # shapes took 9 of SmolLM2's bench's 17 minutes and say nothing a decoding user feels
    shape_latency=False,
    # Its memory too: a 128-token prompt and 16 tokens decoded, at batch 1
    memory_decode=16,
    # SmolLM2-135M's 300 passages of each text (134.5 M parameters: 26–31 s a text and row on 2 cores); on
    # Qwen2.5-0.5B's shape (494 M) reading all of them took 10.6 of its bench's 11.4 minutes. The budget reads 81
    # passages at 0.5B, 32 at 1B
    quality_parameter_passages=300 * 135e6,
)
GRAPH_KINDS = (ENCODER, CAUSAL_LM)


def graph_kind(path: str | Path) -> GraphKind:
    """The kind of the ONNX graph at `path`, from its inputs and outputs; one clear error if none fits."""
    graph = load_graph(path, with_data=False).graph
    inputs = [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}]
    outputs = [o.name for o in graph.output]
    for kind in GRAPH_KINDS:
        if kind.recognises(inputs, outputs):
            return kind
    wanted = "; ".join(f"{k.name}: {list(k.inputs)} → {k.output}" for k in GRAPH_KINDS)
    names = ", ".join(k.name for k in GRAPH_KINDS)
    raise CompressorError(
        f"{str(path)!r} is not a graph of a kind bench knows ({names}): it maps {sorted(inputs)} to {outputs}; "
        f"bench needs {wanted}"
    )
