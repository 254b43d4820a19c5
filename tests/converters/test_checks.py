"""An export's spec (converters/cli/specs.py: export_spec) and its checks before any work
(converters/pipeline/checks.py: check_export): the default output's name, a refusal that writes nothing, and the
shortlist's rank the checks resolve for the export."""

import pytest

from compressor.errors import CompressorError
from converters.cli import build_parser
from converters.cli.options import export_form_values
from converters.cli.specs import export_spec
from converters.kinds import kind_for_config
from converters.pipeline.checks import check_export


def _spec(source, *argv):
    args = build_parser().parse_args(["export", *map(str, argv)])
    return export_spec(vars(args), source, export_form_values(args))


def test_the_default_output_is_named_for_the_model_and_the_scheme(tiny_bert_dir):
    named = _spec(tiny_bert_dir, tiny_bert_dir, "--quantize", "int8")
    assert named.out == tiny_bert_dir.with_name(f"{tiny_bert_dir.name}-int8-onnx") and named.folder
    assert _spec(tiny_bert_dir).out.name == "original-onnx"  # the default model's
    assert not _spec(tiny_bert_dir, tiny_bert_dir, "--out", "x/m.onnx").folder


def test_a_planned_scheme_is_refused_before_anything_is_written(tiny_bert_dir, tmp_path):
    spec = _spec(tiny_bert_dir, tiny_bert_dir, "--quantize", "mixed", "--out", tmp_path / "out")
    with pytest.raises(CompressorError, match="use compressor run --budget SIZE --quantize mixed"):
        check_export(spec, kind_for_config(tiny_bert_dir))
    assert not (tmp_path / "out").exists()


def test_the_shortlists_rank_is_half_the_hidden_width_unless_given(tiny_llama_dir, tmp_path):
    kind = kind_for_config(tiny_llama_dir)  # hidden width 48
    out = ("--out", tmp_path / "out")
    assert check_export(_spec(tiny_llama_dir, tiny_llama_dir, "--shortlist", 8, *out), kind).shortlist_rank == 24
    given = _spec(tiny_llama_dir, tiny_llama_dir, "--shortlist", 8, "--shortlist-rank", 16, *out)
    assert check_export(given, kind).shortlist_rank == 16
    assert check_export(_spec(tiny_llama_dir, tiny_llama_dir, *out), kind).shortlist_rank is None
