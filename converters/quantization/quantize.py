"""Quantization stacked on any exported graph (DESIGN §2.6) with ONNX Runtime's own tools: int8 is
`quantize_dynamic` with per-channel int8 weights (MatMul weights, factor matrices, TT cores and
tables behind a Gather alike), the one line every user knows; int8-aware first smooths the graph's
activation outliers into its weights from calibration batches (converters.quantization.smoothing, exact in
fp32), then quantizes the same way. int4 and int4-aware are 4-bit weights (converters.quantization.int4):
block-wise MatMulNBits and GatherBlockQuantized, int4-aware after smoothing at its own α; every
4-bit graph keeps its block scales in half precision (converters.quantization.half_scales), and a tied
table's rows are read from its head's codes (converters.quantization.tied_codes). int4-corrected and
int4-trained spend a low rank on the rounding error (converters.quantization.correction, .training); w4a8 is
int4-trained's file multiplied in int8 (converters.quantization.int8_products). A
quantized graph is checked against its own fp32 graph: the relative error ‖y_q − y‖ / ‖y‖ of the
output on inputs the exporter never saw must stay under REL_TOL of its width. The schemes' names, groups and
option checks are converters.quantization.schemes'."""

import copy
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from compressor.errors import CompressorError, ExportParityError
from converters.export import PARITY_SHAPES, sample_inputs
from converters.quantization.byte_scales import byte_scales
from converters.quantization.codebook_table import codebook_bits
from converters.quantization.correction import (
    CORRECTION_SHARE,
    add_corrections,
    bias_before_correction,
    check_correction_share,
    input_grams,
    rounding_errors,
    store_factors,
)
from converters.quantization.correction_plan import plan_corrections
from converters.quantization.gptq import gptq_rounded
from converters.quantization.grid import add_offsets, grid_matmuls, off_grid, offset_residual
from converters.quantization.half_scales import half_scales
from converters.quantization.int4 import (
    INT4_ACCURACY,
    INT4_AWARE_ALPHA,
    INT4_BLOCK,
    check_int4_options,
    eight_bit_layers,
    four_bit_codes,
    matmul_weights,
    name_nodes,
    quantize_4bit,
    quantize_matmuls,
    quiet_quantizer,
)
from converters.quantization.int8_products import int8_layers, int8_products
from converters.quantization.mixed import quantize_mixed
from converters.quantization.products import products_as_matmul
from converters.quantization.schemes import (
    CALIBRATED,
    CORRECTED,
    HEAD_SCHEMES,
    INT8_PRODUCTS,
    PLANNED,
    SCHEMES,
    TRAINED,
    check_int8_products,
    check_linear_bits,
    check_scale_bits,
    check_table_bits,
    check_table_head,
    table_block_of,
    weight_width,
)
from converters.quantization.sensitivity import four_bit_losses
from converters.quantization.smoothing import SMOOTH_ALPHA, activation_absmax, outliers, smooth
from converters.quantization.table_head import TABLE_HEAD, frequent_ids
from converters.quantization.target_cpu import int8_level, reduces_range, resolve_target
from converters.quantization.three_bit_linear import three_bit_storage
from converters.quantization.three_bit_table import three_bit_outputs
from converters.quantization.tied_codes import TRANSPOSED, share_tied_codes, smoothing_of, tied_pairs
from converters.quantization.tied_head import split_tied_head
from eval.benchmark import GATE_FAILED_KEY, PARITY_KEY
from eval.graph import file_bytes, make_session
from eval.kinds import graph_kind
from eval.probe import full_feed
from files.atomic import atomic_file

__all__ = [
    "CALIBRATION_PASSAGES",
    "REL_TOL",
    "TARGET_KEY",
    "QuantizeResult",
    "quantize_onnx",
    "is_quantized",
]

# w4a8 at int4's α too: at int8-aware's 0.8 more layers hold their inputs in one int8 scale, but the 4-bit
# rounding loses more (recall@10 0.9277 / 0.9180 against 0.9325 / 0.9210: BENCHMARKS.md, "4-bit codes, int8 products").
SMOOTHING = {"int8-aware": SMOOTH_ALPHA, "int4-aware": INT4_AWARE_ALPHA, **dict.fromkeys(CORRECTED, INT4_AWARE_ALPHA)}
# Passages of the calibration text the aware schemes read: the maxima it takes grow with the text (on
# all-MiniLM-L6-v2, 256 pydoc passages: recall@10 0.936; all 292: 0.943).
CALIBRATION_PASSAGES = 1024
# Relative output error a quantized graph may have against its fp32 graph, by width. Measured on
# random ids (before the gate read text): int8 0.15 for all-MiniLM-L6-v2 and 0.20 for its fine-tuned
# TT rank-64 variant, 0.566 for a 110M MPNet whose int8 keeps 0.925 recall@10 (random ids make
# activations no text makes); int4 0.27 (plain) and 0.20 (aware) for all-MiniLM-L6-v2, 0.29 for its
# emb4 variant. On text (BENCHMARKS.md, "The int8 gate on text"): int8 0.164, int8-aware 0.121 for
# all-MiniLM-L6-v2. A graph quantized wrongly is near 1. An LM's is of its next-token probabilities, below
# 1.0 at any width (eval.kinds.CAUSAL_LM.gated).
REL_TOL = {"int8": 0.35, "int4": 0.5, "w4a8": 0.5, "mixed": 0.5}
PARITY_BATCHES = 4  # batches of the calibration text the gate reads
TARGET_KEY = "compressor.target_cpu"  # the metadata naming the CPU an int8 graph's weights were written for
QUANTIZED_OPS = {
    "DynamicQuantizeLinear",
    "DynamicQuantizeMatMul",
    "MatMulInteger",
    "QuantizeLinear",
    "DequantizeLinear",
    "MatMulNBits",
    "GatherBlockQuantized",
}


@dataclass(frozen=True)
class QuantizeResult:
    path: Path
    parity_max_abs: float  # against the fp32 graph
    parity_rel: float  # ‖y_q − y‖ / ‖y‖ against the fp32 graph
    parity_input: str  # what both were fed: passages of text, or random ids when the caller had none
    eight_bit: tuple[str, ...] = ()  # int4-aware and the corrected schemes: the MatMul nodes kept in 8 bits
    corrections: dict | None = None  # int4-corrected: MatMul output → its rank and errors (correction.Correction)
    int8_layers: tuple[str, ...] = ()  # w4a8: the MatMul outputs multiplied in int8 (int8_products.int8_layers)
    table_bits: float = 4  # the word table's (tail's) width as written: below 4 only where a lookup went narrower
    linear_bits: int = 4  # the corrected schemes' linear layers (those not in 8 bits): 4, or 3 (three_bit_linear)
    outliers: dict | None = None  # the smoothed schemes: layer → its input's max / median channel (OUTLIER_RATIO up)
    gate_failed: str | None = None  # keep_failed: why the graph, kept, is off its gate

    def table_note(self, asked: float) -> str | None:
        """What to say when `asked` (--table-bits) is not what the graph holds: a table not in whole blocks (a
        compressed table's factors) stays in 4 bits."""
        if asked == self.table_bits:
            return None
        return (
            f"--table-bits {asked:g} found no word table of whole blocks (and codebook pieces): {self.path}'s tables "
            "stay in 4 bits"
        )


def is_quantized(path: Path) -> bool:
    """Whether the graph already holds quantized operators."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return any(node.op_type in QUANTIZED_OPS for node in graph.node)


def _parity(fp32: Path, quantized: Path, vocab: int, text: list[dict] | None) -> tuple[float, float, str]:
    """(max |y_q − y|, ‖y_q − y‖ / ‖y‖, what it was fed) of the first output as its graph kind gates it
    (GraphKind.gated: an LM's log-probabilities): on the first PARITY_BATCHES batches of `text` (real
    tokens, padding left out), else on the export parity check's random ids."""
    kind = graph_kind(fp32)
    reference, other = make_session(fp32), make_session(quantized)
    names = [i.name for i in reference.get_inputs()]
    if text:
        feeds, fed = text[:PARITY_BATCHES], f"{sum(len(f[names[0]]) for f in text[:PARITY_BATCHES])} passages of text"
    else:
        shapes = PARITY_SHAPES
        feeds = [{n: x.numpy() for n, x in zip(names, sample_inputs(vocab, b, t, seed))} for b, t, seed in shapes]
        fed = "random ids"
    worst, diff2, ref2 = 0.0, 0.0, 0.0
    output = reference.get_outputs()[0].name
    for feed in feeds:
        (y,) = reference.run([output], full_feed(reference, feed))
        (y_q,) = other.run([output], full_feed(other, feed))
        mask = feed.get("attention_mask")
        if mask is not None and mask.shape == y.shape[:2]:  # real tokens only
            y, y_q = y[mask.astype(bool)], y_q[mask.astype(bool)]
        y, y_q = kind.gated(y), kind.gated(y_q)
        worst = max(worst, float(np.abs(y_q - y).max()))
        diff2 += float(((y_q - y) ** 2).sum())
        ref2 += float((y**2).sum())
    return worst, (diff2 / max(ref2, 1e-30)) ** 0.5, fed


def _corrected(
    exported,
    proto,
    calibration,
    kind,
    block,
    accuracy_level,
    share,
    train,
    head,
    table_block,
    vocab,
    int8=frozenset(),
    table_bits=4,
    linear_bits=4,
    tied_head=(),
):
    """int4-aware's rounding of `proto` (the smoothed graph of `exported`; its linear layers in `linear_bits`)
    with the word table's `head` rows in 8 bits (but weights on a 4-bit grid keep it: grid.py) and every layer
    not on such a grid, and an LM's head (a layer of `vocab` outputs), rounded by GPTQ on its grid (gptq.py),
    then one byte budget (`share` of the 4-bit codes) spent on each layer's rounding error, as a low-rank
    correction or as 8 bits instead, or 4 for a layer in 3 (correction_plan.plan_corrections); an LM's head (a
    tied one's 4-bit codes are its lookup's too) is offered a rank but not 8 bits (its corrected logits are two
    more (batch, sequence, V) tensors at the peak; a tied head is never trained: tied_student), and a tied
    head's 8-bit halves (`tied_head`, node names: tied_head.py) kept so; `train` (None: the closed-form fit
    kept) then trains the corrections, the layers `int8` (output names) with their inputs rounded
    to 8 bits as they will be multiplied. (graph, corrections' report, 8-bit layers)."""
    name_nodes(proto.graph)
    grams = input_grams(proto, calibration)
    rounding = {"aware": True, "head": head, "table_block": table_block, "keep_grid": True, "table_bits": table_bits}
    rounding.update(linear_bits=linear_bits, eight_bit=tuple(tied_head))
    outputs = {node.name: node.output[0] for node in proto.graph.node}
    nodes = {out: name for name, out in outputs.items()}
    tables = {node.name for node in proto.graph.node if node.input[1:2] and node.input[1].endswith(TRANSPOSED)}
    layers = matmul_weights(proto.graph)
    logits = frozenset(outputs[name] for name, (_, n) in layers.items() if n == vocab or name in tables)
    grid = frozenset(outputs[name] for name in grid_matmuls(proto, block))
    gptq = (frozenset(outputs[name] for name in layers) - grid) | logits  # a grid's error is its offsets' (grid.py)
    quantized = gptq_rounded(quantize_4bit(proto, block, accuracy_level, **rounding), proto, grams, gptq)
    losses = four_bit_losses(proto, calibration, kind, block, accuracy_level, grams, quantized, True, linear_bits)
    budget = int(share * four_bit_codes(proto))
    layer_losses = {outputs[n]: loss for n, loss in losses.items()}
    wider = None  # the 3-bit layers in 4, each offered so
    if linear_bits == 3:
        wider = quantize_matmuls(copy.deepcopy(proto), block, accuracy_level, True, eight_bit=tied_head, keep_grid=True)
        wider = gptq_rounded(wider, proto, grams, gptq)
    plan = plan_corrections(quantized, proto, grams, layer_losses, budget, logits, kind.factor_form, grid, block, wider)
    ranks, eight, offset, four = plan
    eight_bit, four_bit = (tuple(nodes[out] for out in chosen) for chosen in (eight, four))
    if eight_bit or four_bit:
        widths = {"eight_bit": tied_head + eight_bit, "four_bit": four_bit}
        quantized = gptq_rounded(
            quantize_4bit(proto, block, accuracy_level, **{**rounding, **widths}), proto, grams, gptq
        )
    corrected = add_corrections(quantized, proto, grams, ranks)
    if train is not None:
        corrected = train(exported, proto, corrected, int8, frozenset(offset))
    corrected, corrections = store_factors(corrected, proto, grams, kind.factor_form)
    report = {out: c.to_dict() for out, c in corrections.items()}
    offsets = {out: e for out, e in rounding_errors(corrected, proto).items() if out in offset}  # as trained
    for out, error in offsets.items():
        left = offset_residual(error, grams[out].numpy(), block)
        report[out] = {"offsets": error.shape[0] // block, "loss_share_left": left}
    report.update({out: {"bits": 4} for out in four})  # 3-bit layers held in 4 bits
    return add_offsets(bias_before_correction(corrected), offsets, block), report, eight_bit


def _stored_scales(model: onnx.ModelProto, scale_bits: int) -> onnx.ModelProto:
    """A 4-bit graph's scales as written: the linear layers' in one byte (`scale_bits` 8: byte_scales), the rest
    (and with 16 all) in fp16 (half_scales)."""
    return half_scales(byte_scales(model) if scale_bits == 8 else model)


def _int8(plain: Path, out: Path, per_channel: bool, target: str) -> None:
    """ONNX Runtime's dynamic int8 of `plain`, its weights in 7 bits for a `target` that sums pairs in int16."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with quiet_quantizer():
        reduce = reduces_range(target)
        quantize_dynamic(plain, out, per_channel=per_channel, weight_type=QuantType.QInt8, reduce_range=reduce)


def quantize_onnx(
    src: Path,
    dst: Path,
    vocab: int,
    scheme: str = "int8",
    calibration: list[dict] | None = None,
    block: int = INT4_BLOCK,
    accuracy_level: int = INT4_ACCURACY,
    widths: dict[str, str] | None = None,
    correction: float = CORRECTION_SHARE,
    train=None,
    table_head: int = TABLE_HEAD,
    table_block: int | None = None,
    table_bits: float = 4,
    scale_bits: int = 16,
    linear_bits: int = 4,
    frequencies: np.ndarray | None = None,
    target_cpu: str | None = None,
    keep_failed: bool = False,
) -> QuantizeResult:
    """Quantize the fp32 graph `src` into `dst` (parity-checked against `src`, then renamed);
    `calibration`: the graph's input batches, for the schemes in CALIBRATED; `block`,
    `accuracy_level`: of the 4-bit schemes (converters.quantization.int4); `widths`: module → width,
    for mixed; `correction`: the bytes int4-corrected's low-rank corrections may add, a share of the
    4-bit codes (converters.quantization.correction); `train`: for int4-trained, (exported fp32 graph,
    its smoothed graph, the corrected graph with fp32 factors) → that graph with trained factors
    (converters.quantization.training.trainer); `table_head`: for the data-aware 4-bit schemes, the word
    table's rows of the calibration text's `table_head` most frequent tokens in 8 bits (0: none;
    converters.quantization.table_head; a tied LM's in its logits too: tied_head), ranked by `frequencies` (V,)
    when given, else by the batches' counts; `table_block`: the 4-bit schemes' tables in blocks of this many
    weights (None: `table_block_of`'s default); `table_bits`: the data-aware 4-bit schemes' word table (its
    tail, with a head, the head then in 4 bits) in 4 or 3 bits (converters.quantization.three_bit_table);
    `scale_bits`: the 4-bit linear layers' block scales in fp16 (16) or one byte (8: byte_scales); `linear_bits`: the
    corrected schemes' linear layers in 4 or 3 bits (converters.quantization.three_bit_linear); `target_cpu`: the CPU
    whose integer path the int8 products are written for (None: this machine's; converters.quantization.target_cpu);
    `keep_failed`: a graph off its gate is kept, its error in the result and the metadata, not refused."""
    if scheme not in SCHEMES:
        raise CompressorError(f"a quantization scheme is one of {', '.join(SCHEMES)}, got {scheme!r}")
    if weight_width(scheme) == 4:
        check_int4_options(block, accuracy_level)
    if table_block is not None:
        check_int4_options(table_block, accuracy_level)
    check_correction_share(correction)
    check_table_head(table_head, HEAD_SCHEMES)  # its rows only: run gives one --table-head to every row
    check_table_bits(table_bits, HEAD_SCHEMES)
    check_scale_bits(scale_bits, SCHEMES)
    check_linear_bits(linear_bits, CORRECTED)
    if scheme in PLANNED and not widths:
        raise CompressorError(f"{scheme} quantizes each module at the width a byte budget chose; this model has none")
    if scheme in CALIBRATED and not calibration:
        raise CompressorError(f"{scheme} needs calibration batches")
    if (scheme in TRAINED) != (train is not None):
        raise CompressorError(f"a trainer of the corrections goes with {' or '.join(TRAINED)}, not with {scheme}")
    target_cpu = resolve_target(target_cpu)
    src, dst = Path(src), Path(dst)
    if is_quantized(src):
        raise CompressorError(f"{str(src)!r} is already quantized; quantize its fp32 graph instead")
    check_int8_products([scheme], graph_kind(src))
    check_table_bits(table_bits if scheme in HEAD_SCHEMES else 4, HEAD_SCHEMES, graph_kind(src))
    linear_bits = linear_bits if scheme in CORRECTED else 4
    check_linear_bits(linear_bits, CORRECTED, graph_kind(src))
    with atomic_file(dst, needed=file_bytes(src) // 3) as tmp, tempfile.TemporaryDirectory() as work:
        plain = Path(work) / "plain.onnx"  # without the fp32 parity of the metadata
        proto = products_as_matmul(onnx.load(str(src)))
        del proto.metadata_props[:]
        exported = proto
        width, eight_bit, outlying = scheme.split("-")[0], (), None
        if scheme in SMOOTHING:  # for the corrected, not an activation whose weights sit on a 4-bit grid (grid.py)
            absmax = activation_absmax(proto, calibration)
            outlying = outliers(proto, absmax)
            proto = smooth(proto, off_grid(proto, absmax, block) if scheme in CORRECTED else absmax, SMOOTHING[scheme])
        head = frequent_ids(calibration, vocab, table_head, frequencies) if scheme in HEAD_SCHEMES else None
        tied_head = split_tied_head(proto, head) if head is not None and len(head) else ()
        head = None if tied_head else head  # a tied table's head is in both its reads, not the lookup's alone
        if scheme == "int4-aware":
            losses = four_bit_losses(proto, calibration, graph_kind(src), block, accuracy_level)
            eight_bit = tuple(eight_bit_layers(proto, losses))
        corrections, table_block, int8 = None, table_block_of(scheme, block, table_block), frozenset()
        four = weight_width(scheme) == 4
        tied = {table: smoothing_of(proto.graph, table) for table in tied_pairs(proto.graph)} if four else {}
        if scheme in CORRECTED:
            kind = graph_kind(src)
            int8 = int8_layers(proto, calibration) if scheme in INT8_PRODUCTS else int8
            corrected, corrections, eight_bit = _corrected(
                exported,
                proto,
                calibration,
                kind,
                block,
                accuracy_level,
                correction,
                train,
                head,
                table_block,
                vocab,
                int8,
                table_bits if scheme in HEAD_SCHEMES else 4,
                linear_bits,
                tied_head,
            )
            corrected = _stored_scales(share_tied_codes(corrected, tied), scale_bits)
            corrected = three_bit_storage(corrected) if linear_bits == 3 else corrected
            level = int8_level(target_cpu)
            onnx.save_model(int8_products(corrected, int8, level) if scheme in INT8_PRODUCTS else corrected, str(tmp))
        elif scheme == "mixed":
            onnx.save_model(_stored_scales(quantize_mixed(proto, widths, block, accuracy_level), scale_bits), str(tmp))
        elif width == "int4":
            aware = scheme in CALIBRATED
            bits = table_bits if scheme in HEAD_SCHEMES else 4
            quantized = quantize_4bit(
                proto, block, accuracy_level, aware, tied_head + eight_bit, head, table_block, table_bits=bits
            )
            onnx.save_model(_stored_scales(share_tied_codes(quantized, tied), scale_bits), str(tmp))
        else:
            onnx.save_model(proto, str(plain))
            _int8(plain, tmp, graph_kind(src).int8_per_channel, target_cpu)
        worst, rel, fed = _parity(src, tmp, vocab, calibration)
        tolerance = graph_kind(src).gate_tol or REL_TOL[width]
        failed = None
        if not rel <= tolerance:
            failed = f"the {scheme} graph of {str(src)!r} is off its fp32 graph by {rel:.3g} (relative, on {fed}), "
            failed += f"above {tolerance}"
            if not keep_failed:
                raise ExportParityError(failed)
        proto = onnx.load(str(tmp))
        props = {PARITY_KEY: repr(worst), "compressor.parity_rel": repr(rel), "compressor.parity_input": fed}
        props.update({GATE_FAILED_KEY: failed} if failed else {})
        if width == "int8" or scheme in INT8_PRODUCTS:
            props[TARGET_KEY] = target_cpu
        onnx.helper.set_model_props(proto, props)
        onnx.save_model(proto, str(tmp))
    bits = 3 if three_bit_outputs(proto.graph) else codebook_bits(proto.graph) or 4
    eight, int8 = eight_bit, tuple(sorted(int8))
    return QuantizeResult(dst, worst, rel, fed, eight, corrections, int8, bits, linear_bits, outlying, failed)
