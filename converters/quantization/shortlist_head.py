"""A shortlist head for the fused decoder's graph (`compressor export --shortlist K`): at a decoding step (one new
token) the logits x W over the V tokens (W, D × V, the weight the head's last product multiplies by) are first
scored by a rank-r fit, s = (x A) B, A B the activation-aware truncation of W in the Gram of x over calibration text
(head_fit: the truncation of compressor.lowrank.whitened_factors, found from D × D products so that a 262k-token
head is never held in float64 whole; its factors in 4 bits where the head is n-bit); only the K best of s are scored
exactly, x · w_v, from the head's own rows (GatherBlockQuantized over its 4- or 8-bit codes, or a Gather of its fp32
tied table), and every other logit is −∞: greedy decoding keeps the head's choice wherever it is among the K (up to the
rounding of x to 8 bits a 4-bit head's MatMulNBits makes and the exact rows do not: near-ties can fall either way).
A pass over several tokens (a prompt, a verifier's pass) keeps the whole head: an If on the sequence length. A step
reads (D + V) r of the factors and K D of the head instead of V D."""

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from compressor.errors import CompressorError
from converters.nbits_storage import dequantize_grid, nbits_grid
from converters.quantization.corrections.errors import input_rows
from converters.quantization.rounding.int4 import quantize_matmuls
from converters.quantization.storage.half_scales import half_scales
from converters.quantization.storage.tied_codes import nbits_rows, plain_blocks
from eval.graph import load_graph
from files.onnx_files import weight_array

__all__ = [
    "SHORTLIST_RANK",
    "SHORTLIST_PASSAGES",
    "SHORTLIST_SCHEMES",
    "check_shortlist",
    "has_fused_head",
    "head_fit",
    "head_node",
    "hidden_gram",
    "shortlist_head",
    "step_weight_bytes",
]

# SmolLM2's tied head: rank 256 and K 512 held its argmax on 99.9 % of tokens (benchmarks/lm_shortlist_recall.py)
SHORTLIST_RANK = 256
SHORTLIST_PASSAGES = 64  # calibration passages whose final hidden states make the Gram the factors are fitted in
SHORTLIST_SCHEMES = (None, "int4", "int4-aware", "w8")  # their head is one product: an fp32 tied table or n-bit codes
PREFIX = "shortlist"
FIT_ROWS = 16_384  # the head's rows its fit reads at a time: 84 MB of float64 at Gemma 3's width
LOGITS = "logits"


def check_shortlist(shortlist: int, rank: int, vocab: int, hidden: int, scheme: str | None) -> None:
    """One sentence, before any work, for a shortlist (`shortlist` tokens, factors of `rank`) an LM of `vocab`
    tokens and `hidden` width cannot take, or a scheme whose head is no single product."""
    if shortlist < 1 or rank < 1:
        raise CompressorError(f"--shortlist and --shortlist-rank are counts ≥ 1, got {shortlist} and {rank}")
    if shortlist >= vocab:
        raise CompressorError(
            f"a shortlist of {shortlist} tokens is no shorter than this LM's vocabulary of {vocab}: give fewer"
        )
    if rank >= hidden:
        raise CompressorError(
            f"a shortlist's rank {rank} is not below this LM's hidden width {hidden}, so its scores read no fewer "
            "bytes than the head: give --shortlist-rank below it"
        )
    if scheme not in SHORTLIST_SCHEMES:
        raise CompressorError(
            f"a shortlist scores the head of an fp32, int4, int4-aware or w8 graph, whose logits are one product; "
            f"--quantize {scheme}'s are not"
        )


def head_node(model: onnx.ModelProto) -> onnx.NodeProto:
    """The node that writes the logits: a MatMulNBits of plain blocks, or a FusedMatMul of an fp32 table (V × D)
    transposed (a tied head); refused otherwise."""
    node = next((n for n in model.graph.node if LOGITS in n.output), None)
    inits = {i.name: i for i in model.graph.initializer}
    if node is not None and node.op_type == "MatMulNBits" and plain_blocks(node):
        return node
    trans_b = node is not None and any(a.name == "transB" and a.i == 1 for a in node.attribute)
    table = inits.get(node.input[1]) if node is not None else None
    if node is not None and node.op_type == "FusedMatMul" and trans_b and table is not None and len(table.dims) == 2:
        return node
    made = "no node" if node is None else f"a {node.op_type}"
    raise CompressorError(
        f"a shortlist scores a head whose logits are an n-bit product or an fp32 tied table's; {made} writes "
        "this graph's logits"
    )


def has_fused_head(graph: Path) -> bool:
    """Whether the graph at `graph` (read without its weights) has a head a shortlist takes (head_node)."""
    try:
        head_node(load_graph(graph, with_data=False))
    except CompressorError:
        return False
    return True


def _row_blocks(model: onnx.ModelProto, head: onnx.NodeProto):
    """Wᵀ's rows (V × D, float64, the head's rows as it multiplies by them) FIT_ROWS at a time: dequantized from
    its codes, or read from its fp32 tied table."""
    if head.op_type == "MatMulNBits":
        grid = nbits_grid(model.graph, head)
        for start in range(0, grid.scales.shape[0], FIT_ROWS):
            yield dequantize_grid(grid, slice(start, start + FIT_ROWS)).T
        return
    table = weight_array(next(i for i in model.graph.initializer if i.name == head.input[1]))
    for start in range(0, len(table), FIT_ROWS):
        yield table[start : start + FIT_ROWS].astype(np.float64)


def head_fit(blocks, gram: np.ndarray, rank: int, damp: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """(A, D × r; B, r × V) of the rank-r fit x A B of the logits x Wᵀ (W: V × D, its rows given a block at a time by
    `blocks()`, read twice) in the Gram G of x: with S Sᵀ = G + λI (Cholesky, λ = damp · mean diag G, grown tenfold
    while it fails), W S ≈ U_r Σ_r Q_rᵀ from the top r eigenpairs (Q_r, Σ_r²) of Sᵀ (WᵀW) S, D × D, summed over the
    blocks; A = S⁻ᵀ Q_r Σ_r^½, B = Σ_r^-½ (W S Q_r)ᵀ = Σ_r^½ U_rᵀ, so A B = S⁻ᵀ Q_r Q_rᵀ Sᵀ Wᵀ."""
    eye, lam = np.eye(len(gram)), damp * max(float(np.diag(gram).mean()), 1e-30)
    for _ in range(12):
        try:
            whitener = np.linalg.cholesky(gram + lam * eye)
            break
        except np.linalg.LinAlgError:
            lam *= 10
    else:
        raise CompressorError("the head input's Gram stays indefinite after regularisation: is the text finite?")
    inner = sum(w.T @ w for w in blocks())
    values, vectors = np.linalg.eigh(whitener.T @ inner @ whitener)
    top = np.argsort(values)[::-1][:rank]
    root = np.sqrt(np.maximum(values[top], 1e-30))
    basis = whitener @ vectors[:, top]  # S Q_r
    down = np.linalg.solve(whitener.T, vectors[:, top]) * np.sqrt(root)  # A = S⁻ᵀ Q_r Σ^½
    up = np.concatenate([(w @ basis).T for w in blocks()], axis=1) / np.sqrt(root)[:, None]  # B = Σ^-½ (W S Q_r)ᵀ
    return down.astype(np.float32), up.astype(np.float32)


def hidden_gram(graph: Path, batches: list[dict]) -> np.ndarray:
    """Σ xᵀx (D × D, float64) of the head's input x over the real tokens of `batches`, as the graph at `graph`
    computes it (correction.input_rows: the head's logits, V wide a token, never computed)."""
    model = load_graph(graph)
    name = head_node(model).input[0]
    gram = None
    for rows in input_rows(model, [name], batches):
        x = rows[name].astype(np.float64)
        gram = x.T @ x if gram is None else gram + x.T @ x
    return gram


def _factors(model: onnx.ModelProto, head: onnx.NodeProto, gram: np.ndarray, rank: int):
    """(nodes of constants, for the main graph; nodes for the step's branch; initializers; the scores' name):
    s = (x A) B, the rank-r fit of W in `gram`, in MatMulNBits of the head's blocks and accuracy where it is 4-bit."""
    down, up = head_fit(lambda: _row_blocks(model, head), gram, rank)  # A: D × r, B: r × V
    x, mid, scores = head.input[0], f"{PREFIX}_low", f"{PREFIX}_scores"
    nodes = [
        helper.make_node("MatMul", [x, f"{PREFIX}_down"], [mid], name=f"{PREFIX}_down_matmul"),
        helper.make_node("MatMul", [mid, f"{PREFIX}_up"], [scores], name=f"{PREFIX}_up_matmul"),
    ]
    inits = [numpy_helper.from_array(down, f"{PREFIX}_down"), numpy_helper.from_array(up, f"{PREFIX}_up")]
    if head.op_type != "MatMulNBits":
        return [], nodes, inits, scores
    attrs = {a.name: helper.get_attribute_value(a) for a in head.attribute}
    values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in (x, scores)]
    tiny = helper.make_model(helper.make_graph(nodes, PREFIX, values[:1], values[1:], inits))
    tiny.opset_import[0].version = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    quantized = half_scales(quantize_matmuls(tiny, attrs["block_size"], attrs["accuracy_level"], False))
    casts = [n for n in quantized.graph.node if n.op_type == "Cast"]
    steps = [n for n in quantized.graph.node if n.op_type != "Cast"]
    return casts, steps, list(quantized.graph.initializer), scores


def shortlist_head(model: onnx.ModelProto, gram: np.ndarray, shortlist: int, rank: int) -> onnx.ModelProto:
    """`model` (the fused decoder's graph, changed in place) whose head scores a one-token pass by its `shortlist`
    best of a rank-`rank` fit in the head input's Gram `gram` (hidden_gram), −∞ elsewhere; several tokens, whole."""
    graph = model.graph
    head = head_node(model)
    casts, steps, inits, scores = _factors(model, head, gram, rank)
    graph.initializer.extend(inits)
    const = {
        "one": np.array([1], np.int64),
        "last": np.array([-1], np.int64),
        "none": np.array(-np.inf, np.float32),
    }
    graph.initializer.extend(numpy_helper.from_array(v, f"{PREFIX}_{k}") for k, v in const.items())
    picked, ids, rows, exact = (f"{PREFIX}_{n}" for n in ("top", "ids", "rows", "exact"))
    count = numpy_helper.from_array(np.array([shortlist], np.int64))  # in the graph, read without its weights
    steps.append(helper.make_node("Constant", [], [f"{PREFIX}_k"], name=f"{PREFIX}_k", value=count))
    top = helper.make_node("TopK", [scores, f"{PREFIX}_k"], [picked, ids], name=f"{PREFIX}_topk", axis=-1, sorted=0)
    steps.append(top)  # unsorted: the K are scattered back to their places
    if head.op_type == "MatMulNBits":  # what reads only constants (scales reshaped, zero points) stays outside, folded
        gather = nbits_rows(model, head, ids, rows, f"{PREFIX}_head")
        moving = {ids}
        for node in gather:
            if moving & set(node.input):
                moving.update(node.output)
        casts += [n for n in gather if not moving & set(n.input)]
        steps += [n for n in gather if moving & set(n.input)]
    else:
        steps.append(helper.make_node("Gather", [head.input[1], ids], [rows], name=f"{PREFIX}_gather"))
    column = f"{PREFIX}_column"
    steps += [
        helper.make_node("Unsqueeze", [head.input[0], f"{PREFIX}_last"], [column], name=f"{PREFIX}_unsqueeze"),
        helper.make_node("MatMul", [rows, column], [f"{exact}_column"], name=f"{PREFIX}_exact"),
        helper.make_node("Squeeze", [f"{exact}_column", f"{PREFIX}_last"], [exact], name=f"{PREFIX}_squeeze"),
        helper.make_node("Shape", [scores], [f"{PREFIX}_shape"], name=f"{PREFIX}_shape"),
        helper.make_node("Expand", [f"{PREFIX}_none", f"{PREFIX}_shape"], [f"{PREFIX}_fill"], name=f"{PREFIX}_fill"),
        helper.make_node(
            "ScatterElements", [f"{PREFIX}_fill", ids, exact], [f"{PREFIX}_logits"], name=f"{PREFIX}_scatter", axis=-1
        ),
    ]
    whole = onnx.NodeProto.FromString(head.SerializeToString())
    whole.output[0] = f"{PREFIX}_whole_logits"
    branch = {
        "then_branch": helper.make_graph(
            steps, f"{PREFIX}_step", [], [helper.make_tensor_value_info(f"{PREFIX}_logits", TensorProto.FLOAT, None)]
        ),
        "else_branch": helper.make_graph(
            [whole], f"{PREFIX}_whole", [], [helper.make_tensor_value_info(whole.output[0], TensorProto.FLOAT, None)]
        ),
    }
    ids_input = next(i.name for i in graph.input if i.name == "input_ids")
    length, one_token = f"{PREFIX}_length", f"{PREFIX}_one_token"
    main = [
        helper.make_node("Shape", [ids_input], [length], name=length, start=1, end=2),
        helper.make_node("Equal", [length, f"{PREFIX}_one"], [one_token], name=one_token),
        helper.make_node("If", [one_token], [LOGITS], name=f"{PREFIX}_if", **branch),
    ]
    at = list(graph.node).index(head)
    graph.node.remove(head)
    for k, node in enumerate([*casts, *main]):
        graph.node.insert(at + k, node)
    return model


def step_weight_bytes(model: onnx.ModelProto, total: int) -> int:
    """The weight bytes a one-token pass of `model` reads, from `total`, all of its weights' bytes: with a shortlist
    head, its whole head's weights (codes and scales, or table) but K of their V rows left out; `total` otherwise."""
    branch = next((n for n in model.graph.node if n.op_type == "If" and n.name == f"{PREFIX}_if"), None)
    if branch is None:
        return total
    graphs = {a.name: helper.get_attribute_value(a) for a in branch.attribute}
    whole = graphs["else_branch"].node[0]
    count = next(n for n in graphs["then_branch"].node if n.name == f"{PREFIX}_k")
    k = int(numpy_helper.to_array(count.attribute[0].t)[0])
    inits = {i.name: i for i in model.graph.initializer}
    casts = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Cast"}
    held = [inits[casts.get(name, name)] for name in whole.input[1:] if name and casts.get(name, name) in inits]
    head = sum(int(np.prod(i.dims)) * onnx.helper.tensor_dtype_to_np_dtype(i.data_type).itemsize for i in held)
    rows = held[0].dims[0]
    return total - head + head * k // rows
