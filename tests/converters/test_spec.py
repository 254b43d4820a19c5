"""The typed run spec: made once from argv or a recipe (the same spec from both), frozen, checked when
made, and what the later steps reuse (the plans, the tokenizer) made once from it."""

import dataclasses
import os

import pytest

from compressor.errors import CompressorError
from converters.cli import build_parser
from converters.cli.recipes import parse_recipes
from converters.cli.specs import run_spec, variant_spec
from converters.pipeline.plans import plans_of
from texts.tokens import load_tokenizer


def _values(*argv) -> dict:
    return vars(build_parser().parse_args(["run", *map(str, argv)]))


def test_a_command_line_and_a_recipe_make_the_same_variant():
    argv = variant_spec(
        _values("--method", "tt", "--rank", 64, "--fit", "fisher", "--dense-head", 1024, "--finetune-time", 30)
        | {"quantize": ["int8"]}
    )
    entry = {"method": "tt", "rank": 64, "kind": "fisher", "dense_head": 1024, "finetune_time": 30}
    recipe = parse_recipes({"variants": [{**entry, "quantize": ["int8"]}]}, "test")[0].variant()
    assert (argv.method, argv.quantize, argv.finetune) == (recipe.method, recipe.quantize, recipe.finetune)
    assert argv.finetune.seconds == 30.0 and [c.scheme for c in argv.quantize.schemes] == ["int8"]


def test_the_spec_is_frozen_and_its_plans_are_made_once():
    spec = variant_spec(_values("--method", "lowrank", "--rank", 4, 8))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.method.targets = ("all",)
    plans = plans_of(spec.method)
    assert [p.entries[0][1].rank for p in plans] == [4, 8]  # one variant per value given
    assert plans_of(spec.method) is plans
    assert plans_of(variant_spec(_values("--method", "lowrank", "--rank", 4, 8)).method) is plans  # an equal spec


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--runs", 0), "--runs must be at least 1, got 0"),
        (("--calib-passages", 0), "--calib-passages must be at least 1, got 0"),
        (("--block-size", 24), "block"),
        (("--correction-share", 1.5), r"--correction-share is a share of the 4-bit bytes in \(0, 1\), got 1.5"),
        (("--table-head", -1), "--table-head is a number of table rows, 0 or more, got -1"),
        (("--table-block", 48), "a 4-bit block size is a power of two, at least 16"),
        (("--quantize", "int8", "--table-bits", 3), "--table-bits goes with --quantize .*int4-aware"),
        (("--quantize", "int8", "int8-aware", "--scale-bits", 8), "--scale-bits goes with --quantize .*int4 or"),
        (("--quantize", "int4-aware", "--linear-bits", 3), "--linear-bits goes with --quantize .*int4-corrected"),
        (("--finetune-time", -5), "a fine-tune time budget must be > 0 seconds"),
        (("--quantize", "w4a8", "--correction-time", -1), "--correction-time is a time budget in seconds, > 0, got -1"),
    ],
)
def test_a_bad_value_is_refused_when_the_spec_is_made(argv, message, tmp_path):
    values = _values(*argv, "--out", tmp_path / "out")
    with pytest.raises(CompressorError, match=message):
        run_spec(values, [variant_spec({**values, "method": "lowrank"})], values["out"])


def test_the_tokenizer_is_read_once_per_folder_while_its_files_stay(tiny_bert_dir, tmp_path):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, folder)
    first = load_tokenizer(folder)
    assert load_tokenizer(folder) is first
    config = folder / "tokenizer_config.json"
    stat = config.stat()
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert load_tokenizer(folder) is not first  # a file changed: read again
