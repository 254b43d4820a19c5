"""The quantization scheme registry: every scheme registers once, in its own file under
converters/quantization/schemes/, and `--quantize`'s choices, the scheme options, the recipes' keys, the
spec and the pipeline read it. Nothing else names a scheme.

A scheme is a frozen config dataclass (`SchemeConfig`, a ClassVar `scheme` naming it) whose fields are its
options (converters/options.py: `option_field`, default and help said once), with its checks against a
graph kind (`check`), its graph writer (`write`) and its report fields (`report`); its class variables say
what it needs of the pipeline (calibration batches, a plan's widths, a trainer of its corrections)."""

import importlib
import pkgutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx

from compressor.errors import CompressorError
from converters.options import Option, config_from_options, field_options, register_once
from converters.quantization.rounding.products import products_as_matmul
from eval.kinds import GraphKind
from eval.memory import trim_heap
from files.onnx_files import WeightFile, load_lazy, load_onnx

__all__ = [
    "SchemeConfig",
    "Source",
    "Written",
    "QuantizeResult",
    "register",
    "schemes",
    "scheme_named",
    "Taken",
    "scheme_options",
    "configs_of",
    "check_options",
]


@dataclass(frozen=True)
class Source:
    """What a scheme's writer reads: the exported graph at `path` (`fp32()`), its graph kind, the vocabulary, the
    calibration batches, a folder for scratch files, and what the model gives: `widths` (module → width, a plan's),
    `train` (the corrections' trainer: training.trainer) and `frequencies` (V,) that rank the word table's rows
    (None: the batches' counts)."""

    path: Path
    kind: GraphKind
    vocab: int
    calibration: list[dict] | None
    work: Path
    widths: Mapping[str, str] | None = None
    train: Callable | None = None
    frequencies: np.ndarray | None = None

    def fp32(self, lazy: bool = False) -> onnx.ModelProto:
        """The exported graph read from its file, its products as MatMul and its metadata cleared: the writer's own to
        change, read again at each call, so that what a writer no longer holds is freed (an LM's graph is most of
        the memory, and a weight changed in place leaves its old bytes behind: files.onnx_files); `lazy`: its
        weights left in the file, each read as it is taken (files.onnx_files.load_lazy: a writer a node at a time).
        What the caller let go is given back first (a probe's session, which glibc kept: 1.4 GB at 0.5B)."""
        trim_heap()
        if not lazy:
            proto = products_as_matmul(load_onnx(self.path))
        else:  # a transposed copy it makes (a tied head's) left in a file of its own in `work` too
            with WeightFile(Path(tempfile.mkdtemp(dir=self.work)) / "products") as weights:
                proto = products_as_matmul(load_lazy(self.path), weights)
        del proto.metadata_props[:]
        return proto


@dataclass(frozen=True)
class Written:
    """What a writer reports of the graph it wrote: `eight_bit`, the MatMul nodes kept in 8 bits; `corrections`,
    MatMul output → its rank and errors (correction.Correction); `int8_layers`, the MatMul outputs multiplied in
    int8 (int8_products); `linear_bits`, the linear layers' width (those not in 8 bits); `outliers`, a smoothed
    scheme's layer → its input's max / median channel (smoothing.OUTLIER_RATIO up)."""

    eight_bit: tuple[str, ...] = ()
    corrections: dict | None = None
    int8_layers: tuple[str, ...] = ()
    linear_bits: int = 4
    outliers: dict | None = None


@dataclass(frozen=True, kw_only=True)
class QuantizeResult(Written):
    """A written graph: where, its parity against the fp32 graph (max |y_q − y|, ‖y_q − y‖ / ‖y‖, what both were
    fed: passages of text, or random ids when the caller had none), the word table's width as written (below 4
    only where a lookup went narrower), and `gate_failed`: why a graph kept off its gate is (keep_failed)."""

    path: Path
    parity_max_abs: float
    parity_rel: float
    parity_input: str
    table_bits: float = 4
    gate_failed: str | None = None

    def table_note(self, asked: float) -> str | None:
        """What to say when `asked` (--table-bits) is not what the graph holds: a table not in whole blocks (a
        compressed table's factors) stays in 4 bits."""
        if asked == self.table_bits:
            return None
        return (
            f"--table-bits {asked:g} found no word table of whole blocks (and codebook pieces): {self.path}'s tables "
            "stay in 4 bits"
        )


@dataclass(frozen=True)
class SchemeConfig:
    """A quantization scheme's settings, checked when made. A subclass names its `scheme`, says what it does
    (`summary`, in --quantize's help), the `width` of its weights as the tools name graphs (8, or 4), the
    `gate` (the most relative output error its graph may have against the fp32 graph, unless the graph kind
    says), and whether it reads calibration batches (`calibrated`), quantizes at a plan's widths (`planned`)
    or trains its corrections (`trains`); it writes its graph (`write`)."""

    scheme: ClassVar[str]
    summary: ClassVar[str]
    width: ClassVar[int]
    gate: ClassVar[float]
    calibrated: ClassVar[bool] = False
    planned: ClassVar[bool] = False
    trains: ClassVar[bool] = False

    @property
    def head_rows(self) -> int:
        """The word table's rows kept wider, ranked by the token frequencies (0: none)."""
        return 0

    def target(self) -> str | None:
        """The CPU its int8 products are written for (target_cpu.TARGETS; the graph's metadata names it), or
        None when it writes none."""
        return None

    def targets(self) -> tuple[str, ...]:
        """Every CPU it writes a graph for (target() the one measured here); () when it writes no int8 products."""
        return ()

    def for_target(self, target: str) -> "SchemeConfig":
        """This config writing for `target` alone."""
        return replace(self, target_cpu=target)

    def check(self, kind: GraphKind) -> None:
        """Refuse a graph kind the scheme cannot quantize, before any work."""

    def write(self, source: Source, out: Path) -> Written:
        """Write `source`'s graph quantized into `out`."""
        raise NotImplementedError

    def report(self, result: QuantizeResult) -> dict:
        """The scheme's fields in a report row."""
        return {}

    def notes(self, result: QuantizeResult) -> list[str]:
        """What to warn of in what it wrote."""
        return []

    def to_dict(self) -> dict:
        """{"scheme": its name, "module": the module that registers it, each option field: its value}, in JSON's
        types (a run's rows manifest)."""
        options = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        return {"scheme": self.scheme, "module": type(self).__module__, **options}

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> "SchemeConfig":
        """The config `to_dict` gave, its values checked as when made; its class the registry's, its module imported
        alone where it is not yet registered (the built-in schemes' modules import no PyTorch unless their own
        rounding needs it)."""
        options = dict(data)
        name, module = options.pop("scheme", None), options.pop("module", None)
        if name not in _SCHEMES and isinstance(module, str):
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise CompressorError(f"the scheme {name!r} is registered by {module!r}, not found: {e}") from None
        config = _SCHEMES.get(name)
        if config is None or config.__module__ != module:
            raise CompressorError(f"a scheme's config names a scheme its module registers; got {name!r} of {module!r}")
        known = {f.name for f in fields(config) if f.init}
        if set(options) - known:
            raise CompressorError(f"{name} takes the options {sorted(known)}; got {sorted(options)}")
        return config(**options)


_SCHEMES: dict[str, type[SchemeConfig]] = {}
_builtins_loaded = False


def register(config: type[SchemeConfig]) -> type[SchemeConfig]:
    """Add the scheme of `config` to the registry (a class decorator); a second under the same name is refused."""
    return register_once(_SCHEMES, config.scheme, config, lambda c: c, "scheme")


def schemes() -> dict[str, type[SchemeConfig]]:
    """Every registered scheme's config by name, the 8-bit schemes first; the built-in ones
    (converters/quantization/schemes/*) are imported first."""
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        package = importlib.import_module("converters.quantization.schemes")
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{module.name}")
    return dict(sorted(_SCHEMES.items(), key=lambda item: -item[1].width))


def scheme_named(name: str) -> type[SchemeConfig]:
    known = schemes()
    if name not in known:
        raise CompressorError(f"a quantization scheme is one of {', '.join(known)}, got {name!r}")
    return known[name]


@dataclass(frozen=True)
class Taken:
    """A scheme option and the schemes that take it: by scheme, its option (the help and default as that scheme
    says them)."""

    options: dict[str, Option] = field(default_factory=dict)

    @property
    def option(self) -> Option:
        """The option as the first scheme that takes it declares it (its flag, type, choices)."""
        return next(iter(self.options.values()))


def scheme_options() -> dict[str, Taken]:
    """Each option of the registered schemes once, by dest, in the order the schemes declare them."""
    taken: dict[str, Taken] = {}
    for name, config in schemes().items():
        for f in fields(config):
            if "option" in f.metadata:
                option = f.metadata["option"]
                taken.setdefault(option.dest, Taken()).options[name] = option
    return taken


def configs_of(names, options: Mapping[str, Any]) -> tuple[SchemeConfig, ...]:
    """The config of each scheme of `names` with the options given (`options`: dest → value, None where not
    given; the rest the configs' defaults)."""
    return tuple(config_from_options(scheme_named(name))(options) for name in names)


def check_options(names, options: Mapping[str, Any]) -> None:
    """The options given (dest → value, None where not given), before any work: each value as every scheme that
    takes it checks it (whether `names` asks it or not: the same options make other rows), and a strict option's
    value other than its neutral one (Option.neutral) asked with a scheme of `names` that takes it."""
    for config in schemes().values():
        if any(options.get(o.dest) is not None for o in field_options(config)):
            config_from_options(config)(options)
    for dest, taken in scheme_options().items():
        value = options.get(dest)
        neutral = taken.option.neutral
        given = neutral is not None and value is not None and value != neutral
        if given and not set(names) & set(taken.options):
            raise CompressorError(f"{taken.option.flag} goes with --quantize {' or '.join(taken.options)}")
