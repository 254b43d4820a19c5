"""`compressor generate` end to end (decoding.generate), with every bad input refused."""

import pytest

from tests.conftest import run_cli


def test_generate_prints_the_continuation_and_sampling_follows_its_seed(lm_folder, capsys):
    _, folder = lm_folder
    argv = ("generate", folder, "--prompt", "the value of", "--max-new-tokens", 4)
    code, greedy, err = run_cli(capsys, *argv)
    assert code == 0 and greedy.startswith("the value of"), err
    sampled = [run_cli(capsys, *argv, "--sample", "--seed", 7)[1] for _ in range(2)]
    assert sampled[0] == sampled[1]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (("--max-new-tokens", 0), "at least 1"),
        (("--max-new-tokens", 200), "exceed the model's context of 160"),
        (("--sample", "--temperature", 0), "temperature > 0"),
        (("--tokenizer", "{empty}"), "no tokenizer"),
    ],
)
def test_bad_generate_input_is_one_sentence(lm_folder, tmp_path, capsys, extra, said):
    _, folder = lm_folder
    (tmp_path / "empty").mkdir()
    extra = [str(e).format(empty=tmp_path / "empty") for e in extra]
    code, _, err = run_cli(capsys, "generate", folder, "--prompt", "the cat", *extra)
    assert code == 2 and said in err, err


def test_an_encoders_graph_is_refused(tiny_bert_dir, tmp_path, capsys):
    assert run_cli(capsys, "export", tiny_bert_dir, "--out", tmp_path / "enc")[0] == 0
    code, _, err = run_cli(capsys, "generate", tmp_path / "enc", "--prompt", "a")
    assert code == 2 and "encoder kind" in err
