"""What a run or an export is asked to do, typed and frozen: made once from the command line or a recipe file
(converters/cli) and read by the pipeline (converters/pipeline). Each part checks its own values
when it is made, so a bad one is one sentence before any work."""

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from compressor.errors import CompressorError
from converters.finetune.config import FinetuneConfig
from converters.quantization.registry import SchemeConfig, check_options, configs_of
from texts.prior import PRIOR_WEIGHT, PRIORS

__all__ = [
    "CALIB_PASSAGES",
    "QUANTIZE_ONLY",
    "check_runs",
    "TextSpec",
    "MethodSpec",
    "QuantizeSpec",
    "VariantSpec",
    "RunSpec",
    "ExportSpec",
]

# The default text's calibration passages are short (docstrings: 48 tokens on average): 256 of them
# (12 K tokens) left a whole-model fisher plan at recall@10 0.587 / 0.495 (pydoc / news), 1,024
# (49 K tokens, a 2-minute pass with sensitivities) at 0.728 / 0.618 (BENCHMARKS.md).
CALIB_PASSAGES = 1024
# A recipe's method that compresses nothing: the original itself, quantized with the recipe's own settings.
QUANTIZE_ONLY = "none"


@dataclass(frozen=True)
class TextSpec:
    """Where the texts come from: calibration (`calib`, at most `calib_passages` for the statistics;
    its statistics cached unless `no_cache`), fine-tune (`data`), the held-out texts (`eval_text`,
    `second_text`, "none" to skip it; each cut to `eval_passages`). None: the model kind's default."""

    calib: Path | None = None
    calib_passages: int = CALIB_PASSAGES
    no_cache: bool = False
    data: Path | None = None
    eval_text: Path | None = None
    second_text: str | None = None
    eval_passages: int | None = None

    def __post_init__(self):
        if self.calib_passages < 1:
            raise CompressorError(f"--calib-passages must be at least 1, got {self.calib_passages}")


@dataclass(frozen=True)
class MethodSpec:
    """What one variant compresses: `methods` (several only under a budget) with the options given
    (`options`: option dest → a value, or a list of values, one variant each), over `targets`; or the
    plan file `plan`; `budget`: one budget the sizes are chosen under; `freq_prior`, `prior_weight`:
    the token frequencies of the data-aware methods; `planned`: the scheme whose widths the budget chooses
    too (--quantize mixed's config: its block prices the 4-bit width), None: sizes only."""

    methods: tuple[str, ...]
    options: tuple[tuple[str, Any], ...] = ()
    targets: tuple[str, ...] = ("embeddings",)
    budget: str | None = None
    plan: Path | None = None
    freq_prior: str = PRIORS[0]
    prior_weight: float = PRIOR_WEIGHT
    planned: SchemeConfig | None = None

    @cached_property
    def given(self) -> dict[str, Any]:
        """The options given, by dest."""
        return dict(self.options)


@dataclass(frozen=True)
class QuantizeSpec:
    """The quantization schemes a graph is measured in, each a config (converters/quantization/registry.py) made
    from the scheme options given (`options`: dest → value; the rest the configs' defaults), which make the
    configs of the rows measured beside them too (the original's baselines: `with_schemes`)."""

    schemes: tuple[SchemeConfig, ...] = ()
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, names, options: tuple[tuple[str, Any], ...] = ()) -> "QuantizeSpec":
        """The configs of the schemes `names` with `options`, every option checked (registry.check_options)."""
        check_options(names, dict(options))
        return cls(configs_of(names, dict(options)), tuple(options))

    def with_schemes(self, names) -> "QuantizeSpec":
        """The schemes `names` in these options (checked when they were given)."""
        return QuantizeSpec(configs_of(names, dict(self.options)), self.options)


@dataclass(frozen=True)
class VariantSpec:
    """One compressed variant: its methods (None: the original itself, only quantized, its rows NAME-SCHEME),
    fine-tune (None: none), quantization schemes and export forms (`export_forms`: option dest → value, or
    values: one graph each); `kind_options`: the options given that only some model kinds take; `name`,
    else the plan's label; `fp32`: its unquantized graph measured too; `said`: a line said before it is made."""

    method: MethodSpec | None
    quantize: QuantizeSpec = field(default_factory=QuantizeSpec)
    finetune: FinetuneConfig | None = None
    export_forms: tuple[tuple[str, Any], ...] = ()
    kind_options: tuple[str, ...] = ()
    name: str | None = None
    fp32: bool = True
    said: str | None = None


@dataclass(frozen=True)
class RunSpec:
    """A side-by-side measurement: the model (None: the default one), the output folder, the texts,
    the variants (each with the original), the timed runs per latency setting, and the prior (`freq_prior` at
    `prior_weight`) that ranks the table head of the rows no method made (the original's, quantized); a
    compressed variant's rows take its method's."""

    model: str | Path | None
    out: Path
    texts: TextSpec
    variants: tuple[VariantSpec, ...]
    runs: int = 50
    freq_prior: str = PRIORS[0]
    prior_weight: float = PRIOR_WEIGHT
    goal: str | None = None  # what the report's row to deploy is chosen for (eval.goals; None: its default goal)
    kv_cache: str = "int8"  # a causal LM's quantized rows' key-value cache where their graph is the fused decoder
    shortlist: tuple[int, int] | None = None  # (K, rank): a causal LM's w8 and int4 rows, with a shortlist head too

    def __post_init__(self):
        check_runs(self.runs)


@dataclass(frozen=True)
class ExportSpec:
    """One export: the model folder `source` (resolved) to `out` (a model folder, or a graph alone where it ends in
    .onnx), quantized in the first scheme of `quantize` if any, its calibration and fine-tune texts, its export form
    (`export_forms`: option dest → value), the ONNX `opset`, the prior (`freq_prior` at `prior_weight`) that ranks
    the word table's head rows; for a causal LM, its key-value cache (`kv_cache`: fp32 or int8) and a shortlist head
    (`shortlist`: K; `shortlist_rank`: its fit's rank, None: the default for the model's hidden width)."""

    source: Path
    out: Path
    quantize: QuantizeSpec = field(default_factory=QuantizeSpec)
    texts: TextSpec = field(default_factory=TextSpec)
    export_forms: dict[str, Any] = field(default_factory=dict)
    opset: int = 17
    freq_prior: str = PRIORS[0]
    prior_weight: float = PRIOR_WEIGHT
    kv_cache: str = "fp32"
    shortlist: int | None = None
    shortlist_rank: int | None = None

    @property
    def folder(self) -> bool:
        """A model folder is written (else the graph alone, `out` ending in .onnx)."""
        return self.out.suffix != ".onnx"

    @property
    def config(self) -> SchemeConfig | None:
        """The scheme the graph is quantized in (None: fp32)."""
        return self.quantize.schemes[0] if self.quantize.schemes else None


def check_runs(runs: int) -> None:
    """The bench's timed runs per latency setting: at least one."""
    if runs < 1:
        raise CompressorError(f"--runs must be at least 1, got {runs}")
