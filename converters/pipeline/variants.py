"""What `run` and `sweep` share: the graphs of one side-by-side measurement (the original and its
quantized rows first, then each compressed variant, fine-tuned and quantized as asked), and the
bench, the report and the plots of its Pareto fronts over them."""

import copy
import functools
import gc
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from torch import nn

from compressor.errors import CompressorError, ExportParityError, UnmatchedWeightError
from converters.checkpoint import save_compressed
from converters.export import export_form_rows, export_onnx, in_export_form
from converters.kinds.fused_cache import attends_by_gqa, cache_scales, int8_cache
from converters.loading import DEFAULT_MODEL_NAME
from converters.pipeline.calibrating import head_frequencies, token_frequencies
from converters.pipeline.say import say
from converters.pipeline.stages import Stages
from converters.pipeline.steps import compress_and_say, finetune_and_say, plans_and_calibration
from converters.quantization.corrections.training import trainer
from converters.quantization.quantize import quantize_for_targets
from converters.spec import QuantizeSpec, RunSpec, VariantSpec
from eval.benchmark import bench
from eval.graph import load_graph
from eval.pareto import front_quality
from eval.plot import plot_front
from eval.probe import PAST
from eval.report import markdown_table, write_report
from files.model_folder import graph_file, model_folder
from files.onnx_files import save_onnx

__all__ = ["Variants", "output_folder"]

PLOTS = {"file_bytes": "front-size.png", "latency": "front-latency.png", "memory": "front-memory.png"}  # front → plot


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
    """(name, ONNX path) of each graph to measure, and what made it, in order."""

    def __init__(
        self,
        out: Path,
        source: Path,
        vocab: int,
        batches: list[dict] | None,
        fit_for=None,
        frequencies=None,
        kv_cache: str = "fp32",
    ):
        """Each row is a ready model folder OUT/NAME (files.model_folder; a compressed variant's is its
        checkpoint's) holding `source`'s files; `batches`: calibration inputs of the aware schemes;
        `fit_for`: a trained scheme's fine-tune of a model's student (steps.correction_fit); `frequencies`: the
        token frequencies (a cached token_frequencies) that rank the word table's head rows; `kv_cache` int8:
        a quantized row whose graph is the fused decoder gets an int8 key-value cache (kinds/fused_cache.py)."""
        self.out, self.source, self.vocab, self.batches = Path(out), Path(source), vocab, batches
        self.fit_for, self.frequencies, self.kv_cache = fit_for, frequencies, kv_cache
        self.original: nn.Module | None = None  # add_original's model, which add_quantized rounds
        self.graphs: list[tuple[str, Path]] = []
        self.details: list[dict] = []
        self.names: set[str] = set()
        self.stages = Stages()  # each export, row and the bench: its time and peak memory

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
        if name in self.names:
            raise CompressorError(f"two variants are named {name!r}; give them different names")
        self.names.add(name)
        with self.stages.stage(f"{name}: export"), model_folder(self.out / name, self.source, None) as graph:
            export_onnx(model, graph)
        path = self.out / name / graph_file(None)
        if fp32:
            self.graphs.append((name, path))
            self.details.append(detail)
        return path

    def add_rows(
        self, name: str, model: nn.Module, path: Path, detail: dict, quantize: QuantizeSpec, frequencies=None
    ) -> None:
        """The fp32 graph at `path` of `model` quantized with each of `quantize`'s schemes as NAME-SCHEME, the
        table's head rows ranked by `frequencies` (else the run's, the default prior's)."""
        rows = [f"{name}-{config.scheme}" for config in quantize.schemes]
        twice = sorted(self.names.intersection(rows))
        if twice:
            raise CompressorError(f"two rows are named {twice[0]!r}; give the variants different names")
        self.names.update(rows)
        for config, row in zip(quantize.schemes, rows):
            fit = self.fit_for(model, config, row) if config.trains else None
            target = config.target() if len(config.targets()) > 1 else None  # several: one file each, by name
            if target is not None:
                say(f"{row}: one graph for each of {', '.join(config.targets())}; measured here: {target}'s")
            try:
                with self.stages.stage(row), model_folder(self.out / row, self.source, config.width, target) as graph:
                    result = quantize_for_targets(
                        path,
                        graph,
                        config,
                        self.batches,
                        vocab=self.vocab,
                        widths=dict(detail["plan"].get("widths", {})) if config.planned else None,
                        train=trainer(model, fit) if fit is not None else None,
                        frequencies=head_frequencies(config, frequencies or self.frequencies),
                        keep_failed=name == "original" and not config.calibrated,  # the one-line baselines
                    )
                    cache = self._cache(graph)
            except (ExportParityError, UnmatchedWeightError) as e:  # the other rows still get measured
                say(f"warning: no {row} row: {e}")
                continue
            self.graphs.append((row, self.out / row / graph_file(config.width, target)))
            quantization = {
                "scheme": config.scheme,
                "parity_rel_to_fp32": result.parity_rel,
                "parity_input": result.parity_input,
                "kv_cache": cache,
            }
            if result.gate_failed:
                say(f"warning: {row} is kept as the baseline it is, off its gate: {result.gate_failed}")
                quantization["gate_failed"] = result.gate_failed
            if result.outliers:
                quantization["outlier_layers"] = result.outliers
            quantization.update(config.report(result))
            for note in config.notes(result):
                say(f"warning: {row}: {note}")
            self.details.append({**detail, "quantization": quantization})

    def _cache(self, graph: Path) -> str | None:
        """The key-value cache the row's graph at `graph` keeps: int8 (rewritten so here) where the run asks it
        and the graph is the fused decoder's, else fp32; None for a graph without a cache."""
        model = load_graph(graph, with_data=False)
        if not any(i.name.startswith(PAST) for i in model.graph.input):
            return None
        if self.kv_cache != "int8" or not attends_by_gqa(model) or not self.batches:
            return "fp32"
        save_onnx(int8_cache(load_graph(graph), cache_scales(graph, self.batches)), graph)
        return "int8"

    def _free(self, name: str) -> str:
        """`name`, or NAME-2, NAME-3, … when a variant (or its -ft) already has it."""
        candidates = itertools.chain([name], (f"{name}-{i}" for i in itertools.count(2)))
        return next(n for n in candidates if n not in self.names and f"{n}-ft" not in self.names)

    def add_original(self, held: list[nn.Module], quantize: QuantizeSpec, keep: bool = True) -> None:
        """The original and its rows in `quantize`'s schemes (its kind's baselines first) and settings, but
        those a plan sizes. `held`: a list holding the model alone, emptied here; without `keep` (no variant and
        no trained scheme needs the model) its last reference goes once the original is exported, and the rows,
        which round the graph alone, and the bench run without it (an LM's run: its fp32 bytes off each peak)."""
        wanted = tuple(c for c in quantize.schemes if not c.planned)  # no plan, no widths
        self.original = held[0] if keep else None
        path = self._export("original", held, {})
        gc.collect()
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

    def bench_and_report(self, run: RunSpec, source: Path, texts, second, hashes=None) -> dict:
        """One bench of every graph side by side; report.json and report.md in the output folder,
        the table printed. `texts`, `second`: (passages, where) of the eval and second texts; `hashes`: the
        calibration's and fit text's sha256 (eval.environment), recorded beside the eval texts'."""
        model_name = DEFAULT_MODEL_NAME if run.model is None else str(source)
        with self.stages.stage("bench"):
            report = bench(
                self.graphs,
                source,
                *texts,
                model=model_name,
                second_texts=second[0],
                second_text=second[1],
                runs=run.runs,
                **({} if run.goal is None else {"goal": run.goal}),
            )
        report["run"]["stages"] = self.stages.whole()
        for row, extra in zip(report["variants"], self.details):
            row.update(extra)
        report["environment"]["texts"].update(hashes or {})
        json_path, md_path = write_report(report, self.out / "report.json")
        print(markdown_table(report))
        say(f"wrote {json_path} and {md_path}")
        choice = report.get("choice")
        if choice:
            say(f"deploy {choice['row'] or 'nothing'} (goal {choice['goal']}): {choice['why']}")
        for axis, name in PLOTS.items():
            try:
                say(f"wrote {plot_front(report, self.out / name, x=axis)} ({front_quality(report)} against {axis})")
            except CompressorError as e:  # a report without latency (or quality) still stands
                say(f"warning: no {name}: {e}")
        return report
