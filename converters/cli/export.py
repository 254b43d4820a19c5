"""compressor export MODEL [--out FILE.onnx]: a model or checkpoint to ONNX, parity-checked."""

from pathlib import Path

from converters.checkpoint import load_model
from converters.cli.steps import check_outputs, say
from converters.export import export_onnx
from converters.loading import resolve_model_dir

HELP = "export a model or compressed checkpoint to ONNX, parity-checked"


def add_arguments(p) -> None:
    p.add_argument("model", nargs="?", default=None, help="model or checkpoint directory (default: the default model)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="ONNX file to write (default: MODEL_DIR.onnx beside the directory; original.onnx for the default model)",
    )
    p.add_argument("--opset", type=int, default=17, help="ONNX opset, ≥ 17 (default: 17)")


def run(args) -> None:
    source = resolve_model_dir(args.model)
    out = args.out or (source.parent / f"{source.name}.onnx" if args.model else Path("original.onnx"))
    check_outputs(args, ONNX_file=out)
    model, _ = load_model(source)
    result = export_onnx(model, out, opset=args.opset)
    say(f"wrote {result.path} (parity max |ONNX − PyTorch| = {result.parity_max_abs:.2e})")
