"""What `run` and `sweep` share: the graphs of one side-by-side measurement (the original and its
quantized rows first, then each compressed variant, fine-tuned and quantized as asked); the rows, the
bench, the report and the plots of its Pareto fronts over them are a `Rows`'s (rows.py)."""

import copy
import functools
import gc
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from torch import nn

from converters.checkpoint import save_compressed
from converters.export import export_form_rows, export_onnx, in_export_form
from converters.pipeline.calibrating import head_frequencies, token_frequencies
from converters.pipeline.rows import Rows
from converters.pipeline.say import say_traced
from converters.pipeline.steps import compress_and_say, finetune_and_say, plans_and_calibration
from converters.quantization.corrections.training import trainer
from converters.spec import QuantizeSpec, RunSpec, VariantSpec
from files.model_folder import graph_file, model_folder

__all__ = ["Variants", "output_folder"]


@contextmanager
def output_folder(out: Path) -> Iterator[Path]:
    """`out`, removed again when the work inside fails before anything was written in it."""
    created = not out.exists()
    try:
        yield out
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # no empty folder left behind
        raise


class Variants:
    """The original and each variant, exported and added to `rows` (a Rows: each graph's and row's name, path and
    details, in order, and the stages that made them)."""

    def __init__(
        self,
        out: Path,
        source: Path,
        vocab: int,
        batches: list[dict] | None,
        fit_for=None,
        frequencies=None,
        kv_cache: str = "fp32",
        shortlist: tuple[int, int] | None = None,
    ):
        """Each row is a ready model folder OUT/NAME (files.model_folder; a compressed variant's is its
        checkpoint's) holding `source`'s files; `batches`: calibration inputs of the aware schemes;
        `fit_for`: a trained scheme's fine-tune of a model's student (steps.correction_fit); `frequencies`: the
        token frequencies (a cached token_frequencies) that rank the word table's head rows; `kv_cache` int8:
        a quantized row whose graph is the fused decoder gets an int8 key-value cache (quantization/kv_cache.py);
        `shortlist` (K, rank): its w8 and int4 rows are measured with a shortlist head too (Rows)."""
        self.out, self.source, self.vocab = Path(out), Path(source), vocab
        self.fit_for, self.frequencies = fit_for, frequencies
        self.original: nn.Module | None = None  # add_original's model, which add_quantized rounds
        self.rows = Rows(out, source, vocab, batches, kv_cache, shortlist)

    def add(
        self, name: str, model: nn.Module, detail: dict, quantize: QuantizeSpec, fp32: bool = True, frequencies=None
    ) -> None:
        """The model's fp32 graph (measured unless `fp32` is False), and its graph quantized with
        each of `quantize`'s schemes, in its settings, as NAME-SCHEME (its table's head rows ranked by
        `frequencies`, a cached token_frequencies, when given: a method's own prior)."""
        path = self._export(name, model, detail, fp32)
        self.add_rows(name, model, path, detail, quantize, frequencies)

    def _export(self, name: str, model: nn.Module | list[nn.Module], detail: dict, fp32: bool = True) -> Path:
        """The model's fp32 graph as NAME (measured unless `fp32` is False): its path; `model` in a list that holds
        it alone goes once PyTorch's parity outputs are made (export_onnx)."""
        self.rows.claim(name)
        with self.rows.stages.stage(f"{name}: export"), model_folder(self.out / name, self.source, None) as graph:
            export_onnx(model, graph)
        path = self.out / name / graph_file(None)
        if fp32:
            self.rows.add_graph(name, path, detail)
        return path

    def add_rows(
        self, name: str, model: nn.Module, path: Path, detail: dict, quantize: QuantizeSpec, frequencies=None
    ) -> None:
        """The fp32 graph at `path` of `model` quantized with each of `quantize`'s schemes as NAME-SCHEME
        (Rows.add_rows), a trained scheme's fine-tune of `model`, the table's head rows ranked by `frequencies`
        (else the run's, the default prior's)."""

        def train_for(config, row):
            fit = self.fit_for(model, config, row)
            return trainer(model, fit) if fit is not None else None

        self.rows.add_rows(
            name,
            path,
            detail,
            quantize.schemes,
            widths=detail.get("plan", {}).get("widths"),
            train_for=train_for,
            head_counts=lambda config: head_frequencies(config, frequencies or self.frequencies),
        )

    def _free(self, name: str) -> str:
        """`name`, or NAME-2, NAME-3, … when a variant (or its -ft) already has it."""
        candidates = itertools.chain([name], (f"{name}-{i}" for i in itertools.count(2)))
        return next(n for n in candidates if n not in self.rows.names and f"{n}-ft" not in self.rows.names)

    def export_original(self, held: list[nn.Module], quantize: QuantizeSpec, keep: bool = True):
        """(path, schemes) of the original's fp32 graph and its rows' schemes: `quantize`'s but those a plan sizes
        (add_original). Without `keep` (no variant and no trained scheme needs the model: a run of the original's
        rows alone, measuring.py) its last reference, `held`'s, goes once it is exported."""
        self.original = held[0] if keep else None
        say_traced(held[0])
        path = self._export("original", held, {})
        if not keep:
            gc.collect()  # the model, in the cycles it and its export leave, gone before the rows' sessions are made
        return path, tuple(c for c in quantize.schemes if not c.planned)  # no plan, no widths

    def add_original(self, held: list[nn.Module], quantize: QuantizeSpec) -> None:
        """The original and its rows in `quantize`'s schemes (its kind's baselines first) and settings, but
        those a plan sizes, the model kept for the variants. `held`: a list holding the model alone, emptied here."""
        path, wanted = self.export_original(held, quantize)
        self.add_rows("original", self.original, path, {}, replace(quantize, schemes=wanted))

    def add_quantized(self, variant: VariantSpec) -> None:
        """The original's graph quantized in `variant`'s schemes and settings (a variant of no method)."""
        self.add_rows(variant.name, self.original, self.out / "original" / graph_file(None), {}, variant.quantize)

    def add_compressed(self, variant: VariantSpec, run: RunSpec, original: nn.Module, source: Path, ft_texts) -> None:
        """Each plan of `variant` applied to a copy of `original`, saved and added (named after the
        variant, or the plan's label, with the label after the name when there are several plans), in
        each export form asked (NAME-FORM); then fine-tuned on `ft_texts` and added again as NAME-ft,
        unless the variant has no fine-tune."""
        m = variant.method
        plans, calib = plans_and_calibration(m, run.texts, original, source)
        frequencies = functools.cache(
            lambda: token_frequencies(run.texts.calib, m.freq_prior, m.prior_weight, source, self.vocab)
        )
        forms = export_form_rows(dict(variant.export_forms))
        prefix, fp32 = variant.name, variant.fp32

        def add(name: str, model: nn.Module, detail: dict) -> None:
            for suffix, values in forms:
                form = {"export_form": {k: v for k, v in values.items() if v is not None}} if suffix else {}
                graph = in_export_form(model, values, frequencies)
                self.add(f"{name}{suffix}", graph, {**detail, **form}, variant.quantize, fp32, frequencies)

        for plan in plans:
            label = plan.label() if prefix is None else prefix if len(plans) == 1 else f"{prefix}-{plan.label()}"
            name = self._free(label)
            model = copy.deepcopy(original)
            report = compress_and_say(model, plan, calib)
            save_compressed(model, plan, report, source, self.out / name)
            detail = {"plan": plan.to_dict(), "compression": report.to_dict()}
            add(name, model, detail)
            if variant.finetune is not None:
                result = finetune_and_say(model, original, source, variant.finetune, ft_texts)
                save_compressed(model, plan, report, source, self.out / f"{name}-ft", finetune=result)
                add(f"{name}-ft", model, {**detail, "finetune": result})
