"""What an int8 graph's products lose on a CPU without VNNI, emulated on any CPU.

Without VNNI (AVX2; AVX-512 without it) ONNX Runtime's u8 × s8 kernel multiplies with `vpmaddubsw`, which sums the
products of two neighbouring k in int16 and saturates at ±32,767 before the int32 accumulation; with VNNI each
product goes straight into int32. For each MatMulInteger of a graph this script takes the uint8 inputs the graph
computes on the eval text and its int8 weights, and measures the share of pairs that saturate and the relative
error ‖y_avx2 − y‖ / ‖y‖ the saturation adds to the layer's integer output:

    .venv/bin/python benchmarks/int16_pairs.py runs/demo/original-int8 runs/demo/original-int8-aware

Each folder's int8 graph (onnx/model_quantized.onnx) is read; the eval text is the default's (32 passages)."""

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from converters.loading import default_model_path  # noqa: E402
from eval.graph import make_session  # noqa: E402
from eval.kinds import graph_kind  # noqa: E402
from eval.probe import full_feed  # noqa: E402
from files.model_folder import graph_in  # noqa: E402
from texts.tokens import encode_passages, load_tokenizer  # noqa: E402


def saturated_products(a: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, float]:
    """(Σ_k a_k w_k with each neighbouring pair's sum clipped to int16, as vpmaddubsw sums it; the share of pairs
    clipped) for uint8 rows `a` (M × K) and int8 weights `w` (K × N)."""
    a, w = a.astype(np.int64), w.astype(np.int64)
    if a.shape[1] % 2:
        a, w = np.pad(a, ((0, 0), (0, 1))), np.pad(w, ((0, 1), (0, 0)))
    total, clipped, pairs = np.zeros((a.shape[0], w.shape[1]), np.int64), 0, 0
    for k in range(0, a.shape[1], 2):
        pair = a[:, k : k + 1] * w[k] + a[:, k + 1 : k + 2] * w[k + 1]
        clipped += int((np.abs(pair) > 32767).sum())
        pairs += pair.size
        total += np.clip(pair, -32768, 32767)
    return total, clipped / pairs


def layer_losses(graph_path: Path, feeds: list[dict]) -> list[tuple[str, float, float]]:
    """(layer, share of pairs saturated, relative error of its integer output) of each MatMulInteger."""
    model = onnx.load(str(graph_path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    layers = [n for n in model.graph.node if n.op_type == "MatMulInteger" and n.input[1] in inits]
    probe = copy.deepcopy(model)
    probe.graph.output.extend(helper.make_tensor_value_info(n.input[0], onnx.TensorProto.UINT8, None) for n in layers)
    probe.graph.output.extend(helper.make_tensor_value_info(n.input[2], onnx.TensorProto.UINT8, None) for n in layers)
    with tempfile.TemporaryDirectory() as work:
        onnx.save_model(probe, str(Path(work) / "probe.onnx"))
        session = make_session(Path(work) / "probe.onnx")
    names = [n.input[0] for n in layers] + [n.input[2] for n in layers]
    stats = {n.name: [0.0, 0.0, 0.0, 0] for n in layers}  # error², reference², clipped share sum, batches
    for feed in feeds:
        values = dict(zip(names, session.run(names, full_feed(session, feed))))
        for node in layers:
            a = values[node.input[0]].reshape(-1, values[node.input[0]].shape[-1])
            w, zero = inits[node.input[1]], int(values[node.input[2]])
            exact = a.astype(np.int64) @ w.astype(np.int64)
            clipped, share = saturated_products(a, w)
            reference = exact - zero * w.astype(np.int64).sum(0)  # (a − z) w, as both kernels correct for z
            s = stats[node.name]
            s[0] += float(((clipped - exact) ** 2).sum())
            s[1] += float((reference.astype(np.float64) ** 2).sum())
            s[2] += share
            s[3] += 1
    return [(name, s[2] / s[3], (s[0] / max(s[1], 1e-30)) ** 0.5) for name, s in stats.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--passages", type=int, default=32)
    args = parser.parse_args()
    tokenizer = load_tokenizer(default_model_path())
    for folder in args.folders:
        path = graph_in(folder)
        texts, _ = graph_kind(path).passages(None, "eval")
        feeds = encode_passages(tokenizer, texts[: args.passages])
        rows = layer_losses(path, feeds)
        worst = max(rows, key=lambda r: r[2])
        print(
            f"{folder.name}: {len(rows)} layers, pairs saturated {np.mean([r[1] for r in rows]):.4%} on average, "
            f"layers with any {sum(r[1] > 0 for r in rows)}, mean relative error {np.mean([r[2] for r in rows]):.4f}, "
            f"worst {worst[2]:.4f} ({worst[0]})"
        )


if __name__ == "__main__":
    main()
