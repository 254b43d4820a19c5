"""int4-corrected: int4-aware's rounding, then one byte budget (`correction_share` of the 4-bit codes) spent on
each layer's rounding error E = W − Q, as a low-rank correction Q + L R fitted in its input Gram's metric
(corrections/correction.py), as 8 bits instead, as blocks' offsets for a layer on a 4-bit grid (rounding/grid.py)
or as 4 bits for a layer in 3 (corrections/correction_plan.py); the codes chosen by GPTQ (rounding/gptq.py). The
linear layers in `linear_bits`, 4 or 3 (rounding/three_bit_linear.py)."""

import copy
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from compressor.errors import CompressorError
from converters.options import Option, option_field
from converters.quantization.corrections.correction import (
    CORRECTION_SHARE,
    add_corrections,
    bias_before_correction,
    check_correction_share,
    input_grams,
    rounding_errors,
    store_factors,
)
from converters.quantization.corrections.correction_plan import plan_corrections
from converters.quantization.corrections.sensitivity import four_bit_losses
from converters.quantization.registry import QuantizeResult, Source, Written, register
from converters.quantization.rounding.gptq import gptq_rounded
from converters.quantization.rounding.grid import add_offsets, grid_matmuls, off_grid, offset_residual
from converters.quantization.rounding.int4 import (
    four_bit_codes,
    matmul_weights,
    name_nodes,
    quantize_4bit,
    quantize_matmuls,
)
from converters.quantization.rounding.three_bit_linear import LINEAR_BITS, three_bit_storage
from converters.quantization.schemes.int4 import TABLE_BLOCK
from converters.quantization.schemes.int4_aware import Int4AwareConfig
from converters.quantization.storage.tied_codes import TRANSPOSED, share_tied_codes, tied_smoothing
from eval.kinds import GraphKind
from files.onnx_files import loaded, save_onnx

__all__ = ["CORRECTED_TABLE_BLOCK", "Int4CorrectedConfig"]

# The corrected schemes' tables in blocks of at least this many weights unless --table-block says: on
# all-MiniLM-L6-v2 blocks of 64 take int4-trained from 0.176× to 0.167× the file at the same recall@10
# (0.923 / 0.909 against 0.923 / 0.908), the bytes the scales saved left to the corrections; without
# corrections (int4-aware) they are a trade, 0.160× at 0.885 / 0.892 against 0.170× at 0.890 / 0.895
# (BENCHMARKS.md, "The tables' own block").
CORRECTED_TABLE_BLOCK = 64
CORRECTION_SHARE_OPTION = Option(
    "--correction-share",
    "the bytes the low-rank corrections and the layers held in 8 bits may add, a share of the 4-bit codes, in (0, 1)",
    float,
)
LINEAR_BITS_OPTION = Option(
    "--linear-bits",
    "an encoder's linear layers in 4 or 3 bits (3: two bit planes made 4-bit codes at session start, the correction "
    "taking back the coarser rounding)",
    int,
    choices=LINEAR_BITS,
    metavar="BITS",
    neutral=4,
)


@register
@dataclass(frozen=True)
class Int4CorrectedConfig(Int4AwareConfig):
    """int4-aware with `correction_share` of its 4-bit bytes spent on the rounding error, its linear layers in
    `linear_bits`, its tables in blocks of at least CORRECTED_TABLE_BLOCK unless `table_block` says."""

    scheme = "int4-corrected"
    summary = "int4-aware with low-rank corrections of the rounding error, fitted"
    table_block: int | None = option_field(
        None, replace(TABLE_BLOCK, default=f"--block-size, at least {CORRECTED_TABLE_BLOCK}")
    )
    correction_share: float = option_field(CORRECTION_SHARE, CORRECTION_SHARE_OPTION)
    linear_bits: int = option_field(4, LINEAR_BITS_OPTION)

    def __post_init__(self):
        super().__post_init__()
        check_correction_share(self.correction_share)
        if self.linear_bits not in LINEAR_BITS:
            raise CompressorError(f"--linear-bits is one of {', '.join(map(str, LINEAR_BITS))}, got {self.linear_bits}")

    @property
    def tables_block(self) -> int:
        return max(self.block_size, CORRECTED_TABLE_BLOCK) if self.table_block is None else self.table_block

    def check(self, kind: GraphKind) -> None:
        """3-bit linear layers are an encoder's (a `kind` whose products are int8): an LM's grid weights and tied
        head keep 4."""
        super().check(kind)
        if self.linear_bits != 4 and kind.factor_form != "int8":
            raise CompressorError("--linear-bits 3 is for an encoder's linear layers; an LM's keep 4 bits")

    def channels(self, model: onnx.ModelProto, absmax: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Not an activation whose weights sit on a 4-bit grid (grid.py): smoothing would take them off it."""
        return off_grid(model, absmax, self.block_size)

    def int8_inputs(self, model: onnx.ModelProto, calibration: list[dict]) -> frozenset[str]:
        """The MatMul outputs whose inputs the graph rounds to 8 bits: none."""
        return frozenset()

    def products(self, model: onnx.ModelProto, int8: frozenset[str]) -> onnx.ModelProto:
        """The graph as it multiplies: its 4-bit products as they are."""
        return model

    def write(self, source: Source, out: Path) -> Written:
        model, outlying = self.smoothed(source)
        model = loaded(model)  # the corrections read every weight, most of them more than once
        head, tied_head = self.head(source, model)
        tied = tied_smoothing(model.graph)
        int8 = self.int8_inputs(model, source.calibration)
        corrected, corrections, eight_bit = self.corrected(source, model, head, tied_head, int8)
        corrected = self.stored(share_tied_codes(corrected, tied))
        corrected = three_bit_storage(corrected) if self.linear_bits == 3 else corrected
        save_onnx(self.products(corrected, int8), out)
        return Written(eight_bit, corrections, tuple(sorted(int8)), self.linear_bits, outlying)

    def corrected(
        self, source: Source, proto: onnx.ModelProto, head, tied_head: tuple[str, ...], int8: frozenset[str]
    ) -> tuple[onnx.ModelProto, dict, tuple[str, ...]]:
        """int4-aware's rounding of `proto` (the smoothed graph of `source.fp32()`; its linear layers in `linear_bits`)
        with the word table's `head` rows in 8 bits (but weights on a 4-bit grid keep it: grid.py) and every layer
        not on such a grid, and an LM's head (a layer of `vocab` outputs), rounded by GPTQ on its grid (gptq.py),
        then one byte budget (`correction_share` of the 4-bit codes) spent on each layer's rounding error, as a
        low-rank correction or as 8 bits instead, or 4 for a layer in 3 (correction_plan.plan_corrections); an LM's
        head (a tied one's 4-bit codes are its lookup's too) is offered a rank but not 8 bits (its corrected logits
        are two more (batch, sequence, V) tensors at the peak; a tied head is never trained: tied_student), and a
        tied head's 8-bit halves (`tied_head`, node names: tied_head.py) kept so; `source.train` (None: the
        closed-form fit kept) then trains the corrections, the layers `int8` (output names) with their inputs
        rounded to 8 bits as they will be multiplied. (graph, corrections' report, 8-bit layers)."""
        block, level, kind, calibration = self.block_size, self.accuracy_level, source.kind, source.calibration
        name_nodes(proto.graph)
        grams = input_grams(proto, calibration)
        rounding = {"aware": True, "head": head, "table_block": self.tables_block, "keep_grid": True}
        rounding.update(table_bits=self.table_bits, linear_bits=self.linear_bits, eight_bit=tuple(tied_head))
        outputs = {node.name: node.output[0] for node in proto.graph.node}
        nodes = {out: name for name, out in outputs.items()}
        tables = {node.name for node in proto.graph.node if node.input[1:2] and node.input[1].endswith(TRANSPOSED)}
        layers = matmul_weights(proto.graph)
        logits = frozenset(outputs[name] for name, (_, n) in layers.items() if n == source.vocab or name in tables)
        grid = frozenset(outputs[name] for name in grid_matmuls(proto, block))
        gptq = (frozenset(outputs[name] for name in layers) - grid) | logits  # a grid's error is its offsets' (grid.py)
        quantized = gptq_rounded(quantize_4bit(proto, block, level, **rounding), proto, grams, gptq)
        losses = four_bit_losses(proto, calibration, kind, block, level, grams, quantized, True, self.linear_bits)
        budget = int(self.correction_share * four_bit_codes(proto))
        layer_losses = {outputs[n]: loss for n, loss in losses.items()}
        wider = None  # the 3-bit layers in 4, each offered so
        if self.linear_bits == 3:
            wider = quantize_matmuls(copy.deepcopy(proto), block, level, True, eight_bit=tied_head, keep_grid=True)
            wider = gptq_rounded(wider, proto, grams, gptq)
        ranks, eight, offset, four = plan_corrections(
            quantized, proto, grams, layer_losses, budget, logits, kind.factor_form, grid, block, wider
        )
        eight_bit, four_bit = (tuple(nodes[out] for out in chosen) for chosen in (eight, four))
        if eight_bit or four_bit:
            del quantized  # rounded again: the first graph let go before the second is built
            widths = {"eight_bit": tied_head + eight_bit, "four_bit": four_bit}
            quantized = gptq_rounded(quantize_4bit(proto, block, level, **{**rounding, **widths}), proto, grams, gptq)
        corrected = add_corrections(quantized, proto, grams, ranks)
        if source.train is not None:
            corrected = source.train(source.fp32(lazy=True), proto, corrected, int8, frozenset(offset))
        corrected, corrections = store_factors(corrected, proto, grams, kind.factor_form)
        report = {out: c.to_dict() for out, c in corrections.items()}
        errors = rounding_errors(corrected, proto)
        offsets = {out: errors[out] for out in errors if out in offset}  # as trained
        for out, error in offsets.items():
            left = offset_residual(error, grams[out].numpy(), block)
            report[out] = {"offsets": error.shape[0] // block, "loss_share_left": left}
        report.update({out: {"bits": 4} for out in four})  # 3-bit layers held in 4 bits
        return add_offsets(bias_before_correction(corrected), offsets, block), report, eight_bit

    def report(self, result: QuantizeResult) -> dict:
        return {**super().report(result), "correction_share": self.correction_share, "corrections": result.corrections}
