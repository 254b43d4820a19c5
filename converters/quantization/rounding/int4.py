"""4-bit weights through ONNX Runtime's weight-only quantizer (`MatMulNBitsQuantizer`), the half of
the int4 schemes that rounds. A MatMul's constant weight W (K × N) becomes `MatMulNBits`: each
column cut into blocks of `block` rows along K, each block 4-bit codes q with one fp32 scale
(and, asymmetric, a 4-bit zero point z), W ≈ scale · (q − z). A table behind an axis-0 Gather
(V × D: word, position and type embeddings, head/tail and low-rank tables) becomes
`GatherBlockQuantized`, its rows cut into blocks of `block` columns the same way. Anything else
(TT cores, whose Gathers pick slices of 4-D tensors; weights fed by activations) stays fp32.

- `int4` (plain): round to nearest, symmetric, for both: the one line a user would write.
- `int4-aware`: the MatMul weights by k-quant (llama.cpp's asymmetric scale-and-minimum search
  per block, which weighs each entry by |w| + rms of its block), the tables by asymmetric RTN; the
  caller first moves activation outliers into the weights (SmoothQuant at INT4_AWARE_ALPHA, exact in
  fp32), so that the rounding spends its levels where the activations are large (AWQ's idea). Then
  the layers whose 4 bits cost the output most per byte get 8 (`eight_bit_layers`): each MatMul's
  loss is measured with it alone in 4 bits on calibration batches (the graph kind's distance to
  the fp32 output), and the greedy takes the largest loss per added byte while the 8-bit layers add
  at most EIGHT_BIT_SHARE to the 4-bit codes.

`accuracy_level` is MatMulNBits' compute type: 0 unset (fp32), 1 fp32, 2 fp16, 3 bf16, 4 int8
activations (blocks of the input quantized on the fly, integer dot products)."""

import contextlib
import copy
import io
import logging
import math
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
from onnx import version_converter
from tqdm.auto import tqdm

from compressor.errors import CompressorError
from converters.nbits_storage import TABLE_OPSET
from converters.quantization.rounding.grid import grid_matmuls
from converters.quantization.rounding.one_node import Quantizer, each_node
from converters.quantization.rounding.table_head import eight_bit_gather, split_table, word_table
from converters.quantization.rounding.three_bit_linear import three_bit_matmuls
from converters.quantization.rounding.three_bit_table import three_bit_gather
from converters.quantization.storage.codebook_table import CODEBOOK_BITS, codebook_gather, piece_of
from eval.graph import numbers_session
from files.onnx_files import loaded, save_onnx, weight_array

__all__ = [
    "INT4_BLOCK",
    "INT4_ACCURACY",
    "INT4_AWARE_ALPHA",
    "ACCURACY_LEVELS",
    "EIGHT_BIT_SHARE",
    "SENSITIVITY_BATCHES",
    "check_int4_options",
    "quantize_4bit",
    "quantize_matmuls",
    "quantize_tables",
    "layer_losses",
    "eight_bit_layers",
    "four_bit_codes",
    "name_nodes",
    "matmul_weights",
    "matmul_arrays",
    "weight_names",
    "table_gathers",
    "quiet_quantizer",
]

INT4_BLOCK = 32  # block 128 on all-MiniLM-L6-v2: 0.135× the file but recall@10 0.790 (32: 0.837)
# MatMulNBits' compute: measured on all-MiniLM-L6-v2, the same recall@10 at 0 and 4 (0.848, linear
# layers only); 4 is the fastest on this CPU (BENCHMARKS.md).
INT4_ACCURACY = 4
ACCURACY_LEVELS = (0, 1, 2, 3, 4)
# SmoothQuant's α before k-quant, measured with the tables in int4 too (pydoc eval split, recall@10;
# BENCHMARKS.md): 0.3 0.869, 0.4 0.873, 0.5 0.881, 0.6 0.874, 0.7 0.873.
INT4_AWARE_ALPHA = 0.5
# The bytes 8-bit layers may add in int4-aware, a share of the 4-bit codes (V·D/2 + K·N/2 …): on
# all-MiniLM-L6-v2, 0.05 buys four layers (value and output projections of the last blocks, the
# last FFN output): 0.163× → 0.169× the file, recall@10 0.880 → 0.889 (BENCHMARKS.md).
EIGHT_BIT_SHARE = 0.05
SENSITIVITY_BATCHES = 2  # calibration batches each layer's 4-bit loss is measured on


def check_int4_options(block: int, accuracy_level: int = INT4_ACCURACY) -> None:
    """ONNX Runtime's 4-bit kernels take a block of a power of two, at least 16, and its accuracy levels."""
    if block < 16 or block & (block - 1):
        raise CompressorError(
            f"a 4-bit block size is a power of two, at least 16 (ONNX Runtime's kernels); got {block}"
        )
    if accuracy_level not in ACCURACY_LEVELS:
        raise CompressorError(f"a MatMulNBits accuracy level is one of {ACCURACY_LEVELS}, got {accuracy_level}")


def table_gathers(graph: onnx.GraphProto) -> set[str]:
    """Names of the Gather nodes whose data is a 2-D float initializer gathered along axis 0."""
    tables = {i.name for i in graph.initializer if len(i.dims) == 2 and i.data_type == onnx.TensorProto.FLOAT}
    found = set()
    for node in graph.node:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if node.op_type == "Gather" and node.input[0] in tables and axis == 0:
            found.add(node.name)
    return found


@contextmanager
def quiet_quantizer():
    """ONNX Runtime's quantizers log through the root logger: every node skipped, advice to pre-process."""
    root, level = logging.getLogger(), logging.getLogger().level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)


def name_nodes(graph: onnx.GraphProto) -> None:
    """Give every node a name: the quantizer selects and excludes nodes by name."""
    for k, node in enumerate(graph.node):
        node.name = node.name or f"node_{k}_{node.op_type}"


def matmul_weights(graph: onnx.GraphProto) -> dict[str, tuple[int, int]]:
    """MatMul node name → (K, N) of its constant 2-D weight, for the MatMuls the quantizer takes."""
    shapes = {i.name: tuple(i.dims) for i in graph.initializer if len(i.dims) == 2}
    return {n.name: shapes[n.input[1]] for n in graph.node if n.op_type == "MatMul" and n.input[1] in shapes}


def weight_names(graph: onnx.GraphProto) -> dict[str, str]:
    """Output name → weight name of each MatMul with a constant 2-D weight."""
    shapes = {i.name for i in graph.initializer if len(i.dims) == 2}
    return {n.output[0]: n.input[1] for n in graph.node if n.op_type == "MatMul" and n.input[1] in shapes}


def matmul_arrays(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """MatMul output name → its constant 2-D weight (K × N), for the MatMuls the quantizer takes."""
    inits = {i.name: i for i in graph.initializer if len(i.dims) == 2}
    return {
        n.output[0]: weight_array(inits[n.input[1]])
        for n in graph.node
        if n.op_type == "MatMul" and n.input[1] in inits
    }


def quantize_matmuls(
    model: onnx.ModelProto,
    block: int,
    accuracy_level: int,
    aware: bool,
    only=None,
    eight_bit=(),
    keep_grid=False,
    bits: int = 4,
    four_bit=(),
) -> onnx.ModelProto:
    """A new graph: `model` (named nodes) with its MatMul weights in MatMulNBits: all of them,
    or `only` those; `eight_bit` of them (aware only) in 8 bits. ONNX Runtime 1.32's k-quant packs
    the 4-bit zero points of a weight with an odd number of blocks along K wrongly (it fails), so
    those take asymmetric round-to-nearest instead, as do, with `keep_grid` (for the corrected schemes),
    weights already on a 4-bit grid (grid.py). `bits` 3: the 4-bit layers but `four_bit` rounded again in 3
    (three_bit_linear); 8: every layer in 8 bits (plain only)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        KQuantWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    shapes = matmul_weights(model.graph)
    names = set(shapes) if only is None else set(only)
    wide = {node.output[0] for node in model.graph.node if node.name in set(four_bit)}
    weights = {out: w for out, w in matmul_arrays(model.graph).items() if out not in wide} if bits == 3 else {}

    def rtn(bits: int) -> DefaultWeightOnlyQuantConfig:
        return DefaultWeightOnlyQuantConfig(
            block_size=block, is_symmetric=not aware, accuracy_level=accuracy_level, bits=bits
        )

    if aware:
        odd = {n for n in names if -(-shapes[n][0] // block) % 2}
        nearest = odd | (grid_matmuls(model, block, names - odd) if keep_grid else set())
        eight = set(eight_bit)
        kquant = KQuantWeightOnlyQuantConfig(customized_weight_config={n: {"bits": 8} for n in eight_bit})
        passes = [(kquant, names - nearest), (rtn(4), nearest - eight), (rtn(8), nearest & eight)]
    else:
        passes = [(rtn(8 if bits == 8 else 4), names)]

    def quantizer_of(config) -> Quantizer:
        def quantized(one: onnx.ModelProto) -> onnx.ModelProto:
            quantizer = MatMulNBitsQuantizer(
                one, block_size=block, is_symmetric=not aware, accuracy_level=accuracy_level, algo_config=config
            )
            with quiet_quantizer(), contextlib.redirect_stdout(io.StringIO()):  # k-quant prints a progress bar
                quantizer.process()
            return quantizer.model.model

        return quantized

    chosen = {name: quantizer_of(config) for config, names in passes for name in names}
    return three_bit_matmuls(each_node(model, chosen, axes={"MatMul": 1}), weights)


def quantize_tables(
    model: onnx.ModelProto,
    block: int,
    aware: bool,
    only=None,
    head: np.ndarray | None = None,
    bits: float = 4,
    eight_bit: tuple[str, ...] = (),
) -> onnx.ModelProto:
    """`model` (named nodes) with its tables (axis-0 Gathers of 2-D initializers), or `only` those
    Gather nodes among them, in GatherBlockQuantized, asymmetric when `aware`; with `head` (token ids),
    the word table's rows of those ids in 8 bits (converters.quantization.rounding.table_head); the Gathers named in
    `eight_bit` left as they are (a tied head's 8-bit half, whose rows tied_codes reads from its logits' codes).
    With `bits` 3 the word table (its tail, with a head: the head then in 4 bits) goes to 3 bits
    (three_bit_table), with 2, 1.33 or 1 to codes of codebooks (codebook_table). ONNX Runtime's
    quantizer sets opset 21 (4-bit tensors) without converting the graph's operators (a Llama's RMSNorm
    ReduceMean takes its axes as an input from opset 18), so an older graph is converted to opset 21 first."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    with_head = head is not None and len(head)
    if any(o.domain in ("", "ai.onnx") and o.version < TABLE_OPSET for o in model.opset_import):
        model = loaded(model)  # the converter reads the whole graph: its weights left in their file read in
        if not any(o.domain == "com.microsoft" for o in model.opset_import):  # its MatMulNBits, if any
            model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
        model = version_converter.convert_version(model, TABLE_OPSET)
    elif with_head or bits < 4:
        model = loaded(model)  # the word table's rows split or narrowed in the graph itself
    name_nodes(model.graph)

    tables = table_gathers(model.graph) if only is None else table_gathers(model.graph) & set(only)
    tables -= set(eight_bit)
    whole = math.lcm(block, piece_of(bits)) if bits in CODEBOOK_BITS else block  # its rows in blocks (and pieces)
    word = word_table(model.graph, tables, whole) if with_head or bits < 4 else None
    eight, narrow = (), ()
    if word is not None and with_head:
        head_name, tail_name = split_table(model, word, head)
        tables = (tables - {word.name}) | {head_name if bits < 4 else tail_name}
        eight, narrow = ((), (tail_name,)) if bits < 4 else ((head_name,), ())
    elif word is not None:
        tables, narrow = tables - {word.name}, (word.name,)
    config = DefaultWeightOnlyQuantConfig(
        block_size=block, is_symmetric=not aware, op_types_to_quantize=("Gather",), quant_axes=(("Gather", 1),)
    )

    def quantized(one: onnx.ModelProto) -> onnx.ModelProto:
        quantizer = MatMulNBitsQuantizer(one, block_size=block, algo_config=config)
        with quiet_quantizer(), np.errstate(divide="ignore", invalid="ignore"):  # all-zero blocks: scale 0, codes 0
            quantizer.process()
        return quantizer.model.model

    # each table alone and a slice of rows at a time (a row's blocks round alone): the quantizer given the whole
    # graph held ~3 copies of a 262,144-row table (Gemma-3-270M's int4: 2.87 GiB)
    model = each_node(model, dict.fromkeys(tables, quantized), axes={"Gather": 0})
    for name in eight:
        eight_bit_gather(model, name, block)
    for name in narrow:
        if bits == 3:
            three_bit_gather(model, name, block)
        else:
            codebook_gather(model, name, bits)
    return model


def quantize_4bit(
    model: onnx.ModelProto,
    block: int = INT4_BLOCK,
    accuracy_level: int = INT4_ACCURACY,
    aware: bool = False,
    eight_bit: tuple[str, ...] = (),
    head: np.ndarray | None = None,
    table_block: int | None = None,
    keep_grid: bool = False,
    table_bits: float = 4,
    linear_bits: int = 4,
    four_bit: tuple[str, ...] = (),
) -> onnx.ModelProto:
    """A new graph: `model` (its nodes named) with 4-bit MatMul weights and tables (module docstring); `aware` picks the
    int4-aware rounding (k-quant and asymmetric tables) over symmetric round-to-nearest, and with
    it the MatMul (and Gather) nodes named in `eight_bit` and the word table's rows of the token ids `head` get 8 bits,
    and with `keep_grid` weights on a 4-bit grid keep it (grid.py); the tables in blocks of `table_block`
    (None: `block`), the word table (its tail, with a head) in `table_bits` (4; 3: three_bit_table; 2, 1.33, 1:
    codebook_table), the MatMul weights not in 8 bits in `linear_bits` (4, or 3: three_bit_linear; those named
    in `four_bit` then in 4)."""
    check_int4_options(block, accuracy_level)
    if (eight_bit or head is not None) and not aware:
        raise CompressorError("8-bit layers are a choice of int4-aware (k-quant); plain int4 rounds every layer alike")
    name_nodes(model.graph)  # the caller's graph named, not copied: each_node builds a new one
    model = quantize_matmuls(
        model,
        block,
        accuracy_level,
        aware,
        eight_bit=eight_bit,
        keep_grid=keep_grid,
        bits=linear_bits,
        four_bit=four_bit,
    )
    return quantize_tables(model, table_block or block, aware, head=head, bits=table_bits, eight_bit=eight_bit)


def layer_losses(
    model: onnx.ModelProto,
    feeds: list[dict],
    kind,
    block: int = INT4_BLOCK,
    accuracy_level: int = INT4_ACCURACY,
    keep_grid: bool = False,
    bits: int = 4,
) -> dict[str, float]:
    """MatMul node name → the graph kind's loss (`kind.loss`) of the output when that layer alone
    is in 4 bits (k-quant; `keep_grid`, `bits`: as quantize_matmuls), against `model`'s own output on `feeds`."""
    check_int4_options(block, accuracy_level)
    model = copy.deepcopy(model)
    name_nodes(model.graph)
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "layer.onnx"
        save_onnx(model, path)
        reference = kind.represent(numbers_session(path), feeds)
        losses = {}
        for name in tqdm(matmul_weights(model.graph), desc=f"each layer's {bits}-bit loss", leave=False):
            alone = quantize_matmuls(
                copy.deepcopy(model), block, accuracy_level, True, {name}, keep_grid=keep_grid, bits=bits
            )
            save_onnx(alone, path)
            losses[name] = kind.loss(reference, kind.represent(numbers_session(path), feeds, reference))
    return losses


def four_bit_codes(model: onnx.ModelProto) -> float:
    """Bytes of the 4-bit codes of the graph's MatMul weights and tables, scales aside: half a byte a weight."""
    sizes = [k * n for k, n in matmul_weights(model.graph).values()]
    gathers = table_gathers(model.graph)
    tables = {n.input[0] for n in model.graph.node if n.name in gathers}
    return (sum(sizes) + sum(int(np.prod(i.dims)) for i in model.graph.initializer if i.name in tables)) / 2


def eight_bit_layers(model: onnx.ModelProto, losses: dict[str, float], share: float = EIGHT_BIT_SHARE) -> list[str]:
    """The MatMuls to keep in 8 bits: by loss per added byte (K·N/2 each), largest first, while the
    added bytes stay within `share` of the graph's 4-bit codes (its MatMul weights and tables)."""
    sizes = {name: k * n for name, (k, n) in matmul_weights(model.graph).items()}
    codes = four_bit_codes(model)
    chosen, spent = [], 0.0
    for name in sorted(losses, key=lambda n: losses[n] / sizes[n], reverse=True):
        if spent + sizes[name] / 2 <= share * codes:
            chosen.append(name)
            spent += sizes[name] / 2
    return chosen
