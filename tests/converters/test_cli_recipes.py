"""Sweep recipe files: every bad file is one sentence before anything runs; a good one becomes
the variant spec `compressor run` would have made of its options."""

import json

import pytest

from compressor.errors import CompressorError
from converters.cli.builtin_recipes import DEFAULT_RECIPES, SMALL_RECIPE, THREE_BIT_RECIPE, TINY_RECIPE
from converters.cli.recipes import (
    Recipe,
    load_recipes,
    parse_recipes,
    quantize_choices,
)
from converters.pipeline.plans import plans_of
from converters.quantization.registry import schemes


def _names(quantize) -> tuple[str, ...]:
    """The schemes of a QuantizeSpec, by name."""
    return tuple(config.scheme for config in quantize.schemes)


VALID = {
    "variants": [
        {
            "name": "tt-64",
            "method": "tt",
            "rank": 64,
            "kind": "fisher",  # the old spelling of "fit", still read
            "dense_head": 1024,
            "quantize": ["fp32", "int8"],
        },
        {"method": "lowrank", "budget": 0.5, "targets": ["ffn"], "finetune_time": 300, "lr": "1e-3"},
        {"name": "lr-keep", "method": "lowrank", "keep": 0.25, "fit": "plain", "quantize": ["int8-aware"]},
    ]
}


def write(tmp_path, data) -> str:
    path = tmp_path / "recipes.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def one(variant: dict) -> dict:
    return {"variants": [{"name": "v", **variant}]}


def test_a_valid_file_round_trips(tmp_path):
    recipes = load_recipes(write(tmp_path, VALID))
    tt, budget, keep = recipes
    assert tt == Recipe("tt", {"rank": 64, "fit": "fisher", "dense_head": 1024}, ("fp32", "int8"), "tt-64")
    assert budget.options == {"budget": "0.5", "targets": ["ffn"], "ft_time": 300.0, "lr": 1e-3}
    assert budget.quantize == ("fp32",) and budget.name is None
    assert load_recipes(write(tmp_path, {"variants": [r.to_dict() for r in recipes]})) == recipes
    assert [p.label() for p in plans_of(tt.variant().method)] == ["tt-head1024-r64-pca-fisher"]
    assert plans_of(keep.variant().method)[0].entries[0][1].keep == 0.25


def test_a_recipe_makes_the_variant_run_would_with_runs_defaults_for_the_rest(tmp_path):
    tt, budget, _ = load_recipes(write(tmp_path, VALID))
    variant = tt.variant("said")
    assert variant.method.methods == ("tt",) and variant.method.given == {
        "rank": 64,
        "fit": "fisher",
        "dense_head": 1024,
    }
    assert variant.method.targets == ("embeddings",) and variant.method.plan is None and variant.finetune is None
    assert _names(variant.quantize) == ("int8",) and (variant.name, variant.fp32, variant.said) == (
        "tt-64",
        True,
        "said",
    )
    tuned = budget.variant()
    assert tuned.method.targets == ("ffn",) and tuned.method.budget == "0.5" and _names(tuned.quantize) == ()
    assert (tuned.finetune.seconds, tuned.finetune.lr, tuned.finetune.steps) == (300.0, 1e-3, None)
    assert budget.options["targets"] == ["ffn"]  # the recipe's own list is left as it was


def test_the_default_recipes_are_valid():
    recipes = load_recipes()
    assert len(recipes) == len(DEFAULT_RECIPES["variants"]) >= 2
    assert set(quantize_choices()) == {"fp32", *schemes()}
    first = recipes[0].variant()  # its corrected rows, and so original-int4-trained and original-w4a8
    assert first.method is not None and _names(first.quantize)[-2:] == ("int4-trained", "w4a8")
    small = next(r.variant() for r in recipes if r.name == SMALL_RECIPE["name"])
    assert small.method is None and not small.fp32 and _names(small.quantize) == ("w4a8",)
    (w4a8,) = small.quantize.schemes
    assert (w4a8.table_bits, w4a8.table_head, w4a8.scale_bits, w4a8.linear_bits) == (3, 4096, 8, 4)
    three = next(r.variant() for r in recipes if r.name == "original-3bit-linear")
    assert (three.method, three.quantize.schemes[0].linear_bits, three.quantize.schemes[0].table_bits) == (None, 3, 3)
    tiny = next(r.variant() for r in recipes if r.name == "original-tiny")
    (tiny_w4a8,) = tiny.quantize.schemes
    assert (tiny_w4a8.linear_bits, tiny_w4a8.table_bits, tiny_w4a8.table_head) == (3, 1.33, 2048)
    assert tiny_w4a8.correction_time == 480
    # each 3-bit recipe plans with its own budget (tiny's 4.5 % over the 3-bit recipe's 3 % it spreads), not the first's
    shares = (three.quantize.schemes[0].correction_share, tiny_w4a8.correction_share)
    assert shares == (THREE_BIT_RECIPE["correction_share"], TINY_RECIPE["correction_share"]) == (0.03, 0.045)


def test_a_schemes_field_may_be_a_recipes_key_without_a_flag():
    """correction_lr, the trained schemes' learning rate (Option(flagged=False)): a recipe sets it, the command line
    has no --correction-lr, and each scheme keeps its own default otherwise."""
    from converters.cli import build_parser

    entry = {"method": "none", "quantize": ["int4-trained", "w4a8"]}
    trained, w4a8 = parse_recipes(one({**entry, "correction_lr": 1e-3}), "test")[0].variant().quantize.schemes
    assert trained.correction_lr == w4a8.correction_lr == 1e-3
    trained, w4a8 = parse_recipes(one(entry), "test")[0].variant().quantize.schemes
    assert (trained.correction_lr, w4a8.correction_lr) == (2e-4, 3e-3)  # each scheme's own
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--quantize", "w4a8", "--correction-lr", "1e-3"])


def test_a_recipe_of_no_method_is_the_original_in_its_own_settings():
    entry = {"method": "none", "quantize": ["fp32", "w4a8"], "table_bits": 3, "correction_time": 5}
    original, named = parse_recipes({"variants": [entry, {**entry, "name": "small"}]}, "test")
    variant = original.variant()
    assert variant.method is None and variant.name == "original" and named.variant().name == "small"
    assert _names(variant.quantize) == ("w4a8",) and not variant.fp32  # the original's fp32 row is measured once
    (w4a8,) = variant.quantize.schemes
    assert (w4a8.table_bits, w4a8.correction_time, variant.finetune) == (3, 5.0, None)
    tt = one({"method": "tt", "table_bits": 3, "quantize": ["int4-aware"]})
    assert parse_recipes(tt, "test")[0].variant().quantize.schemes[0].table_bits == 3  # a compressed variant's too


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "is not JSON"),
        (b"\xff\xfe{}", "is not JSON"),
        ([1, 2], 'object with a "variants" list'),
        ({"variant": []}, 'object with a "variants" list'),
        ({"variants": []}, "has no variants"),
        ({"variants": ["tt"]}, r"variants\[0\] is not an object"),
        (one({"rank": 4}), r"variants\[0\] \('v'\) names no method"),
        (one({"method": "ttt"}), r"unknown method 'ttt'; the closest is 'tt'"),
        (one({"method": ["lowrank", "phmm"], "budget": "0.5"}), r"unknown method 'phmm'; the closest is 'phm'"),
        (one({"method": [], "budget": "0.5"}), r'"method" is a method name or a list of them'),
        (one({"method": ["lowrank", "phm"]}), r"--method lowrank phm needs --budget"),
        (one({"method": "tt", "rnak": 4}), r"variants\[0\] \('v'\): unknown option 'rnak'; the closest is 'rank'"),
        (one({"method": "tt", "keep": 0.5}), "'keep' is an option of method lowrank, not of tt"),
        (one({"method": "tt", "calib": "c.txt"}), "'calib' is for the whole sweep, not one variant"),
        (one({"method": "tt", "plan": "p.json"}), "unknown option 'plan'"),
        (one({"method": "tt", "rank": 6.5}), "'rank' takes an integer, got 6.5"),
        (one({"method": "tt", "rank": True}), "'rank' takes an integer, got true"),
        (one({"method": "tt", "rank": [4, 8]}), r"'rank' takes an integer, got \[4, 8\]"),
        (one({"method": "tt", "kind": "fishr"}), "'kind' is one of .*got 'fishr'"),
        (one({"method": "tt", "targets": []}), "'targets' takes a list of text"),
        (one({"method": "tt", "rank": 0}), "rank must be an integer ≥ 1, got 0"),  # the method's own check
        (one({"method": "lowrank", "budget": "0.5", "rank": 4}), "--budget chooses the ranks"),
        (one({"method": "tt", "quantize": ["int2"]}), "unknown quantization scheme 'int2'; the closest is 'int8'"),
        (one({"method": "tt", "quantize": "int8"}), "'quantize' is a list of schemes"),
        (one({"method": "tt", "name": ""}), "a variant's name is non-empty text"),
        ({"variants": [{"name": "a", "method": "tt"}, {"name": "a", "method": "lowrank"}]}, "two variants 'a'"),
        (
            one({"method": "none", "rank": 4, "quantize": ["int8"]}),
            "'rank' is not a quantization setting; method 'none'",
        ),
        (one({"method": "none", "quantize": ["fp32"]}), "method 'none' needs a scheme in 'quantize' beside fp32"),
        (one({"method": "none"}), "'quantize' is a list of schemes"),
        (
            one({"method": "none", "quantize": ["w4a8"], "table_bits": 5}),
            "'table_bits' is one of 4, 3, 2, 1.33, 1, got 5",
        ),
        (one({"method": "none", "quantize": ["int8"], "table_bits": 3}), "--table-bits goes with --quantize"),
    ],
)
def test_a_bad_recipe_file_is_one_sentence(tmp_path, content, message):
    path = tmp_path / "recipes.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        write(tmp_path, content)
    with pytest.raises(CompressorError, match=message) as raised:
        load_recipes(path)
    assert "\n" not in str(raised.value) and str(path) in str(raised.value)


def test_a_missing_recipe_file_is_named(tmp_path):
    with pytest.raises(CompressorError, match="recipe file .*nope.json' does not exist"):
        load_recipes(tmp_path / "nope.json")


def test_errors_name_the_variant_by_index_and_name():
    data = {"variants": [{"method": "tt"}, {"name": "second", "method": "lowrank", "cores": 3}]}
    with pytest.raises(CompressorError, match=r"^test, variants\[1\] \('second'\): 'cores' is an option of method tt"):
        parse_recipes(data, "test")


def _run_values(*argv: str) -> dict:
    from converters.cli import build_parser

    return vars(build_parser().parse_args(["run", *argv]))


def test_run_without_method_options_takes_the_default_run():
    from converters.cli.builtin_recipes import TABLE_RECIPE
    from converters.cli.goals import goal_run
    from converters.cli.recipes import default_run as run_of
    from converters.kinds import kind_named

    def default_run(values, kind):  # the size goal's rows: the rounded baseline, the 3-bit table, the w4a8 recipe
        return run_of(values, kind, goal_run("size"), "goal size")

    encoder, lm = kind_named("encoder"), kind_named("causal-lm")
    rounded, table, small = default_run(_run_values("--out", "x"), encoder)
    assert table.name == TABLE_RECIPE["name"] and table.quantize.schemes[0].table_bits == 3
    assert (rounded.method, rounded.name, _names(rounded.quantize)) == (None, "original", ("int4-aware",))
    assert rounded.quantize.schemes[0].table_bits == 4  # the comparison rows in the default settings
    assert small.name == SMALL_RECIPE["name"] and small.method is None
    settings = {k: v for k, v in SMALL_RECIPE.items() if k not in ("name", "method", "quantize")}
    assert {k: getattr(small.quantize.schemes[0], k) for k in settings} == settings
    assert _names(small.quantize) == tuple(SMALL_RECIPE["quantize"])
    *_, mine = default_run(_run_values("--correction-time", "7", "--runs", "3"), encoder)
    assert mine.quantize.schemes[0].correction_time == 7.0 and mine.quantize.schemes[0].table_bits == 3  # given first
    rows = run_of(_run_values("--target-cpu", "avx2"), encoder, goal_run("balanced"), "goal balanced")
    targets = [c.target_cpu for row in rows for c in row.quantize.schemes if hasattr(c, "target_cpu")]
    assert targets == ["avx2"] * 3  # the machine's option: int8-aware's, int8-w4's and the table's, unnamed row or not
    for given in (["--rank", "64"], ["--method", "tt"], ["--targets", "ffn"], ["--budget", "0.5"]):
        assert default_run(_run_values(*given), encoder) is None  # a method option given: no recipe
    assert default_run(_run_values(), lm) == []  # an encoder's schemes: the LM's run is the original's rows
    (mine,) = default_run(_run_values("--quantize", "int4", "--block-size", "64"), lm)
    assert _names(mine.quantize) == ("int4",) and mine.quantize.schemes[0].block_size == 64
