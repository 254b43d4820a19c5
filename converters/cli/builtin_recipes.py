"""The built-in recipes (converters/cli/recipes.py parses them like a recipe file; `compressor run --recipe NAME`): the
word tables in 3 and 4 bits and the 4-bit recipe the goals measure (eval.goals names them), and the sweep's grid of
variants, each with what it measured when it was chosen."""

from converters.spec import QUANTIZE_ONLY

__all__ = [
    "TABLE_RECIPE",
    "WIDE_TABLE_RECIPE",
    "SMALL_RECIPE",
    "THREE_BIT_RECIPE",
    "TINY_RECIPE",
    "MEDIUM_RECIPE",
    "DEFAULT_RECIPES",
    "builtin_recipes",
]

# int8-aware's products, the word table in 3 bits (its 4,096 most frequent rows in 4, blocks of 32): on MiniLM
# 0.73× int8's file, 0.95× its peak RSS, recall@10 0.931 / 0.924 against int8's 0.906 / 0.915; on the MPNet 0.89×,
# 0.95×, 0.914 / 0.911 (against int4-aware's 0.892 / 0.902 at 1.06× the memory)
TABLE_RECIPE = {
    "name": "original-table3",
    "method": QUANTIZE_ONLY,
    "quantize": ["int8-aware-table"],
    "table_bits": 3,
    "table_head": 4096,
    "table_block": 32,
}
# The same with the table in 4 bits and its frequent rows in 8: MiniLM 0.86× int8's file, recall 0.940 / 0.943
WIDE_TABLE_RECIPE = {**TABLE_RECIPE, "name": "original-table4", "table_bits": 4}

# The 4-bit recipe the size goal measures (converters/cli/goals.py; `compressor run` measured it by default before the
# goals): of the points measured on the size front at about half of original-int8's bytes, the one that keeps the
# most (docs/lab-notes/benchmarks-history.md, "The word table in 3 bits, trained scales, scales in one byte"): the
# original in w4a8 with the word table's 4,096 most frequent rows in 4 bits and the rest in 3 (blocks of 128), the
# linear layers' block scales in one byte, corrections of 0.5 % of the 4-bit bytes, all trained for 240 s against
# the fp32 model: 0.126× the file, recall@10 0.907 / 0.896 (pydoc / news), at 1.8× int8's peak memory (its codes
# become int8 weights when the session starts: docs/lab-notes/2026-11-28-deployment.md).
SMALL_RECIPE = {
    "name": "original-small",
    "method": QUANTIZE_ONLY,
    "quantize": ["w4a8"],
    "correction_share": 0.005,
    "table_bits": 3,
    "table_head": 4096,
    "table_block": 128,
    "scale_bits": 8,
}
# The original in w4a8 with its linear layers in 3 bits too (three_bit_linear) and corrections of 3 % of the 4-bit
# bytes: 0.117× the file (BENCHMARKS.md, "Linear layers in 3 bits"), 0.114× since the budget offers 4 bits.
THREE_BIT_RECIPE = {
    **SMALL_RECIPE,
    "name": "original-3bit-linear",
    "linear_bits": 3,
    "correction_share": 0.03,
}
# The 3-bit recipe with the table's 2,048 most frequent rows in 4 bits and the rest in codebooks, a one-byte code for
# each 6 weights (1.33 bits a weight: codebook_table), a correction budget of 4.5 % of the 4-bit bytes (spent on 12
# of the 36 linear layers in 4 bits, no rank: correction_plan), trained 480 s: 0.0898× the file, recall@10
# 0.843–0.848 / 0.809–0.812 in four runs (BENCHMARKS.md, "A 3-bit layer offered 4 bits" and "The built-in sweep after
# the 4-bit offer"; at 3 % before the 4-bit offer, 0.0887×, 0.836–0.841 / 0.799–0.803).
TINY_RECIPE = {
    **THREE_BIT_RECIPE,
    "name": "original-tiny",
    "table_bits": 1.33,
    "table_head": 2048,
    "correction_share": 0.045,
    "correction_time": 480,
}
# The original in w4a8 at original-int4-aware's bytes: corrections of 22 % of the 4-bit bytes, the block scales in
# one byte, trained 480 s: 0.168× the file, recall@10 0.931 / 0.925, p50 (1,16) t1 0.46×, (8,128) t2 0.82×
# (BENCHMARKS.md, "w4a8 at int4-aware's bytes"; trained 240 s, 0.930 / 0.921 and 0.925 / 0.921).
MEDIUM_RECIPE = {
    "name": "original-medium",
    "method": QUANTIZE_ONLY,
    "quantize": ["w4a8"],
    "correction_share": 0.22,
    "scale_bits": 8,
    "correction_time": 480,
}
# The built-in grid: what `compressor sweep` runs without --recipes, the fronts' points of BENCHMARKS.md ("Sweep"
# and after): emb4, the 2,048 most frequent tokens' rows exact and the rest of the table low-rank at a quarter
# of its parameters (its int4-trained row, 0.111×, a size-front point; the original's int4-trained and w4a8
# rows, 0.168×, come with its schemes), original-medium (0.168×), the default recipe (0.127×), the 3-bit one
# (0.114×), the tiny one (0.090×), and the factorized recipes before them. About 90 minutes on 2 cores (88 on a
# fresh clone at commit 451b3f6, 2026-11-27), 50 of them the eight trained rows (about 5 minutes each,
# original-medium and -tiny 10).
DEFAULT_RECIPES = {
    "variants": [
        {
            "name": "emb4",
            "method": "lowrank",
            "targets": ["embeddings"],
            "keep": 0.25,
            "dense_head": 2048,
            "fit": "aware",
            "quantize": ["fp32", "int8-aware", "int4-aware", "int4-trained", "w4a8"],
        },
        MEDIUM_RECIPE,
        SMALL_RECIPE,
        THREE_BIT_RECIPE,
        TINY_RECIPE,
        {
            "name": "emb8",
            "method": "tt",
            "dense_head": 1024,
            "rank": 150,
            "fit": "aware",
            "finetune_time": 150,
            "quantize": ["fp32", "int8", "int8-aware"],
        },
        {"name": "tt-r64", "method": "tt", "rank": 64, "fit": "aware", "quantize": ["fp32", "int8-aware"]},
        {
            "name": "linear-half",
            "method": "lowrank",
            "targets": ["linear"],
            "budget": "0.5",
            "fit": "fisher",
            "quantize": ["fp32", "int8-aware", "int4-aware"],
        },
        {
            "name": "all-half",
            "method": "lowrank",
            "targets": ["all"],
            "budget": "0.5",
            "dense_head": 2048,
            "fit": "fisher",
            "finetune_time": 240,
            "quantize": ["fp32", "int8-aware", "int4-aware"],
        },
    ]
}


def builtin_recipes() -> dict[str, dict]:
    """Every built-in recipe by name: the goals' and the built-in sweep's."""
    recipes = {recipe["name"]: recipe for recipe in (TABLE_RECIPE, WIDE_TABLE_RECIPE)}
    recipes.update({recipe["name"]: recipe for recipe in DEFAULT_RECIPES["variants"]})
    return recipes
