"""compressor bench ONNX...: measure ONNX models side by side; the first is the reference."""

from pathlib import Path

from converters.cli.options import bench_options
from converters.cli.specs import text_spec
from converters.loading import default_model_path
from converters.pipeline.say import say
from converters.pipeline.steps import eval_texts, second_texts
from converters.quantization.rounding.target_cpu import NATIVE, TARGETS, resolve_target
from converters.spec import check_runs
from eval.benchmark import bench
from eval.graph import initializer_stats, load_graph
from eval.kinds import graph_kind
from eval.report import markdown_table, write_report
from files.atomic import check_writable
from files.model_folder import GRAPH_DIR, folder_of, graph_in, lacks_tokenizer

HELP = "measure ONNX models side by side; the first is the reference"


def add_arguments(p) -> None:
    p.add_argument(
        "onnx",
        nargs="+",
        type=Path,
        help="model folders (their one graph under onnx/) or ONNX files; the first is the original",
    )
    p.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="directory with the tokenizer (default: the first model folder's, else the default model's)",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=Path("report.json"),
        help="report path; report.md is written beside it (default: report.json)",
    )
    p.add_argument(
        "--target-cpu",
        default=None,
        metavar="PATH",
        help=f"of a folder's graphs written one per CPU (model_qint8_TARGET.onnx), the one to measure: "
        f"{', '.join(TARGETS)}; a graph written for another is refused (default: this machine's)",
    )
    bench_options(p)


def run(args) -> None:
    check_runs(args.runs)
    text = text_spec(vars(args))
    check_writable(args.json, "report file")
    target = None if args.target_cpu is None else resolve_target(args.target_cpu)
    graphs = [graph_in(p, target, fallback=resolve_target(NATIVE)) for p in args.onnx]
    kind = graph_kind(graphs[0])
    parameters, _ = initializer_stats(load_graph(graphs[0], with_data=False))
    texts, where = eval_texts(text, kind, parameters)
    second, second_where = second_texts(text, kind, parameters)
    first = folder_of(graphs[0]) if graphs[0].parent.name == GRAPH_DIR else None
    tokenizer = args.tokenizer or (first if first and not lacks_tokenizer(first) else default_model_path())
    names = ["original", *[_name(p) for p in graphs[1:]]]
    report = bench(
        list(zip(names, graphs)),
        tokenizer,
        texts,
        where,
        model=str(args.onnx[0]),
        second_texts=second,
        second_text=second_where,
        runs=args.runs,
    )
    json_path, _ = write_report(report, args.json)
    print(markdown_table(report))
    say(f"wrote {json_path} and {json_path.with_suffix('.md')}")


def _name(graph: Path) -> str:
    """A variant's name in the report: its model folder's, else its file's stem."""
    return folder_of(graph).name if graph.parent.name == GRAPH_DIR else graph.stem
