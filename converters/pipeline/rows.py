"""The rows of a run that round an exported graph (one quantization scheme each) and the one bench over every
graph, with no PyTorch imported: Variants (variants.py) adds its rows and benches through a `Rows`, and a run of an
original's rows alone writes its `Rows` into a manifest once the original is exported (`state`; rows_manifest.py)
that the torch-free stage builds them back from (`from_manifest`; torch_free.py)."""

import sys
from collections.abc import Callable
from pathlib import Path

from compressor.errors import CompressorError, ExportParityError, UnmatchedWeightError
from converters.pipeline.say import say
from converters.pipeline.stages import Stages
from converters.quantization.kv_cache import attends_by_gqa, cache_scales, int8_cache
from converters.quantization.quantize import quantize_for_targets
from converters.quantization.shortlist_head import SHORTLIST_PASSAGES, has_fused_head, hidden_gram, shortlist_head
from eval.benchmark import bench
from eval.environment import run_record
from eval.graph import load_graph
from eval.pareto import front_quality
from eval.plot import plot_front
from eval.probe import PAST
from eval.report import markdown_table, write_report
from files.model_folder import graph_file, model_folder
from files.onnx_files import save_onnx

__all__ = ["Rows"]

LEFT_BEHIND = ("torch", "transformers")  # what the torch-free stage of a run never imports (torch_free.py)
SHORTLIST_ROWS = ("w8", "int4")  # measured with a shortlist head too: the 8-bit row that keeps the answers, the fastest
PLOTS = {"file_bytes": "front-size.png", "latency": "front-latency.png", "memory": "front-memory.png"}  # front → plot


class Rows:
    """(name, ONNX path) of each graph to measure and what made it, in order; each export, row and the bench a stage
    (its time and peak memory)."""

    def __init__(
        self,
        out: Path,
        source: Path,
        vocab: int,
        batches: list[dict] | None,
        kv_cache: str = "fp32",
        shortlist: tuple[int, int] | None = None,
    ):
        """Each row is a ready model folder OUT/NAME (files.model_folder) holding `source`'s files; `batches`:
        calibration inputs of the aware schemes; `kv_cache` int8: a quantized row whose graph is the fused decoder
        gets an int8 key-value cache (quantization/kv_cache.py); `shortlist` (K, rank): each row of SHORTLIST_ROWS
        whose graph is the fused decoder's is measured again as ROW-short, its head a shortlist's (_add_shortlist)."""
        self.out, self.source, self.vocab, self.batches = Path(out), Path(source), vocab, batches
        self.kv_cache, self.shortlist = kv_cache, shortlist
        self.graphs: list[tuple[str, Path]] = []
        self.details: list[dict] = []
        self.names: set[str] = set()
        self.stages = Stages()
        self.after: str | None = None  # the stage after which a torch-free process took these rows on

    def state(self) -> dict:
        """What a manifest keeps of these rows, in JSON's types (rows_manifest.py); the batches, arrays, aside."""
        return {
            "out": str(self.out),
            "source": str(self.source),
            "vocab": self.vocab,
            "kv_cache": self.kv_cache,
            "shortlist": self.shortlist,
            "graphs": [[name, str(path)] for name, path in self.graphs],
            "details": self.details,
            "names": sorted(self.names),
            "stages": self.stages.done,
        }

    @classmethod
    def from_manifest(cls, state: dict, batches: list[dict] | None) -> "Rows":
        """The rows `state` (a `state()` read back) and `batches` hold, taken on by the torch-free stage of their
        run, whose report says which of LEFT_BEHIND it imported (`run.torch_free`)."""
        shortlist = tuple(state["shortlist"]) if state["shortlist"] else None
        rows = cls(Path(state["out"]), Path(state["source"]), state["vocab"], batches, state["kv_cache"], shortlist)
        rows.graphs = [(name, Path(path)) for name, path in state["graphs"]]
        rows.details, rows.names = list(state["details"]), set(state["names"])
        rows.stages = Stages(state["stages"])
        rows.after = rows.stages.done[-1]["stage"] if rows.stages.done else None
        return rows

    def claim(self, name: str) -> None:
        """`name` taken for a graph of the run (a variant's fp32 graph), refused where a row has it already."""
        if name in self.names:
            raise CompressorError(f"two variants are named {name!r}; give them different names")
        self.names.add(name)

    def add_graph(self, name: str, path: Path, detail: dict) -> None:
        """The graph at `path` measured as the row NAME (claimed), with `detail` in its report row."""
        self.graphs.append((name, path))
        self.details.append(detail)

    def add_rows(
        self,
        name: str,
        path: Path,
        detail: dict,
        schemes,
        widths: dict | None = None,
        train_for: Callable | None = None,
        head_counts: Callable | None = None,
    ) -> None:
        """The fp32 graph at `path` quantized with each of `schemes` (SchemeConfig) as NAME-SCHEME: `widths`, a
        plan's (a planned scheme's); `train_for(config, row)`, a trained scheme's trainer (variants.py);
        `head_counts(config)`, the counts that rank the word table's head rows (None where it keeps none)."""
        rows = [f"{name}-{config.scheme}" for config in schemes]
        twice = sorted(self.names.intersection(rows))
        if twice:
            raise CompressorError(f"two rows are named {twice[0]!r}; give the variants different names")
        self.names.update(rows)
        for config, row in zip(schemes, rows):
            train = train_for(config, row) if config.trains else None
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
                        widths=dict(widths or {}) if config.planned else None,
                        train=train,
                        frequencies=head_counts(config) if head_counts is not None and config.head_rows else None,
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
            if self.shortlist and config.scheme in SHORTLIST_ROWS and has_fused_head(self.graphs[-1][1]):
                self._add_shortlist(row, config.width, {**detail, "quantization": quantization})

    def _add_shortlist(self, row: str, width: int, detail: dict) -> None:
        """ROW-short: the row's graph (its key-value cache as it is) with a shortlist head (shortlist_head: a step
        scores exactly the K best of a rank-r fit of its head, its fit in the Gram of the head's input over the first
        SHORTLIST_PASSAGES calibration passages), measured beside it."""
        shortlist, rank = self.shortlist
        name, graph = f"{row}-short", self.graphs[-1][1]
        self.claim(name)
        batches, passages = [], 0
        for batch in self.batches:
            if passages >= SHORTLIST_PASSAGES:
                break
            batches.append(batch)
            passages += len(batch["input_ids"])
        with self.stages.stage(name), model_folder(self.out / name, self.source, width) as path:
            save_onnx(shortlist_head(load_graph(graph), hidden_gram(graph, batches), shortlist, rank), path)
        self.graphs.append((name, self.out / name / graph_file(width)))
        short = {"shortlist": shortlist, "rank": rank, "fit_passages": passages}
        self.details.append({**detail, "quantization": {**detail["quantization"], **short}})

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

    def bench_and_report(
        self,
        model_name: str,
        runs: int,
        goal: str | None,
        texts,
        second,
        hashes: dict | None = None,
        inputs=None,
        argv: list[str] | None = None,
    ) -> dict:
        """One bench of every graph side by side; report.json and report.md in the output folder, the table
        printed. `model_name`: the original's, as the report names it; `runs`, `goal`: the run's (None: the bench's
        default goal); `texts`, `second`: (passages, where) of the eval and second texts; `hashes`: the
        calibration's and fit text's sha256 (eval.environment), recorded beside the eval texts'; `inputs`: the texts
        tokenised (eval.benchmark.bench_inputs), where the caller has them; `argv`: the command line the report
        names (None: this process's)."""
        with self.stages.stage("bench"):
            report = bench(
                self.graphs,
                self.source,
                *texts,
                model=model_name,
                second_texts=second[0],
                second_text=second[1],
                runs=runs,
                inputs=inputs,
                **({} if goal is None else {"goal": goal}),
            )
        report["run"]["stages"] = self.stages.whole()
        if argv is not None:
            report["run"]["command"] = run_record(argv)["command"]
        if self.after is not None:
            imported = [library for library in LEFT_BEHIND if library in sys.modules]  # none, unless a row needs it
            report["run"]["torch_free"] = {"after": self.after, "imported": imported, "of": LEFT_BEHIND}
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
