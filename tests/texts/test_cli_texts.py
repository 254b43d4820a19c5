"""The held-out texts the commands measure quality on: --eval-text, --second-text, --eval-passages, and the
share an LM reads by default for its size."""

import pytest

from compressor.errors import CompressorError
from converters.cli import build_parser
from converters.cli.specs import text_spec
from converters.pipeline.steps import eval_texts, second_texts
from eval.kinds import CAUSAL_LM, ENCODER
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


def test_a_large_lm_reads_the_first_of_the_held_out_passages_its_budget_allows(tmp_path):
    path = tmp_path / "second.txt"
    path.write_text("\n".join(f"passage {i}" for i in range(400)) + "\n")
    args = bench_args("--second-text", path)
    budget = CAUSAL_LM.quality_parameter_passages
    small, where = second_texts(args, CAUSAL_LM, int(budget // 500))  # a budget above what there is: every passage
    assert len(small) == 400 and where == str(path)
    half, where = second_texts(args, CAUSAL_LM, int(budget // 100))
    assert half == [f"passage {i}" for i in range(100)] and "the first 100 of its 400 passages" in where
    assert len(second_texts(args, CAUSAL_LM, int(budget))[0]) == 32  # a batch at least, however large the model
    assert len(second_texts(args, ENCODER, int(budget))[0]) == 400  # an encoder's quality reads them all
    given = bench_args("--second-text", path, "--eval-passages", 200)
    assert len(second_texts(given, CAUSAL_LM, int(budget))[0]) == 200  # the user's count wins
