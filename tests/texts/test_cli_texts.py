"""The held-out texts the commands measure quality on: --eval-text, --second-text, --eval-passages."""

import pytest

from compressor.errors import CompressorError
from converters.cli import build_parser
from converters.cli.specs import text_spec
from converters.pipeline.steps import eval_texts, second_texts
from eval.kinds import ENCODER
from texts.corpus import default_passages
from texts.news import SECOND_PASSAGES, news_passages


def bench_args(*options):
    return text_spec(vars(build_parser().parse_args(["bench", "model.onnx", *map(str, options)])))


def test_the_second_text_defaults_to_the_news_and_none_skips_it():
    texts, where = second_texts(bench_args(), ENCODER)
    assert texts == news_passages() and len(texts) == SECOND_PASSAGES
    assert "Lee corpus" in where
    assert second_texts(bench_args("--second-text", "none"), ENCODER) == (None, None)


def test_eval_passages_cuts_both_held_out_texts(tmp_path):
    path = tmp_path / "second.txt"
    path.write_text("\n".join(f"passage {i}" for i in range(30)) + "\n")
    args = bench_args("--second-text", path, "--eval-passages", 12)
    assert second_texts(args, ENCODER) == ([f"passage {i}" for i in range(12)], str(path))
    assert eval_texts(args, ENCODER)[0] == default_passages("eval")[:12]


def test_a_second_text_too_short_for_recall_at_10_is_refused(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("one\ntwo\n")
    with pytest.raises(CompressorError, match="at least 11 are needed"):
        second_texts(bench_args("--second-text", path), ENCODER)
