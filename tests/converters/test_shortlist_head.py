"""The shortlist head (converters/quantization/shortlist_head.py, `compressor export --shortlist K`): a decoding step
scores exactly the K best of the head's low-rank fit and nothing else, a prompt's pass is the whole head's, a fit near
full rank keeps the head's argmax, the decode bench counts the rows a step reads, `generate` and GenAI's generator run
the folder, and every model, scheme or size it cannot take is refused before any work."""

import importlib.util

import numpy as np
import pytest

from converters.quantization.shortlist_head import step_weight_bytes
from decoding.decoders import Decoder, open_decoder
from decoding.sampling import decode_ids
from eval.graph import initializer_stats, load_graph, make_session
from tests.conftest import genai_greedy, run_cli, write_tiny_lm

SHORTLIST = 16
PROMPT = np.array([3, 7, 11, 5, 9])
TOKENS = (4, 8, 1, 6, 2, 10)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny Llama whose heads the fused decoder takes (64 wide, 102 tokens), exported whole and with a shortlist of
    16 at rank 16 (and 63, nearly the width), in fp32, and in int4 and w8 with the int8 key-value cache."""
    from converters.cli import main

    root = tmp_path_factory.mktemp("shortlist")
    source = write_tiny_lm(root / "llama", "llama", hidden=64)
    short = ["--shortlist", str(SHORTLIST), "--shortlist-rank"]
    for name, extra in {
        "fp32": [],
        "fp32-short": [*short, "16"],
        "fp32-wide": [*short, "63"],
        "int4": ["--quantize", "int4", "--kv-cache", "int8"],
        "int4-short": ["--quantize", "int4", "--kv-cache", "int8", *short, "16"],
        "w8": ["--quantize", "w8", "--kv-cache", "int8"],
        "w8-short": ["--quantize", "w8", "--kv-cache", "int8", *short, "16"],
    }.items():
        assert main(["export", str(source), "--out", str(root / name), *extra]) == 0
    return root


def _decoder(folder) -> Decoder:
    return open_decoder(make_session(next((folder / "onnx").glob("*.onnx"))))


@pytest.mark.parametrize("form", ["fp32", "int4", "w8"])
def test_a_step_scores_the_shortlist_exactly_and_nothing_else(folders, form):
    whole, short = _decoder(folders / form), _decoder(folders / f"{form}-short")
    tolerance = 1e-5 if form == "fp32" else 0.02  # int4, w8: the rows unrounded, MatMulNBits rounds its input to 8 bits
    a, b = whole.start(PROMPT), short.start(PROMPT)
    assert np.abs(a - b).max() <= tolerance * np.ptp(a)  # the prompt's pass: the whole head's node, in a branch
    for token in TOKENS:
        a, b = whole.step(token), short.step(token)
        kept = np.isfinite(b)
        assert kept.sum() == SHORTLIST and np.isneginf(b[~kept]).all()
        assert np.abs(b[kept] - a[kept]).max() <= tolerance * np.ptp(a)


def test_a_fit_near_full_rank_keeps_the_heads_argmax(folders):
    whole, wide = _decoder(folders / "fp32"), _decoder(folders / "fp32-wide")
    whole.start(PROMPT), wide.start(PROMPT)
    for token in TOKENS:
        a, b = whole.step(token), wide.step(token)
        assert np.isfinite(b[a.argmax()])


def test_the_decode_bench_counts_the_head_rows_a_step_reads(folders):
    plain = load_graph(next((folders / "int4" / "onnx").glob("*.onnx")), with_data=False)
    short = load_graph(next((folders / "int4-short" / "onnx").glob("*.onnx")), with_data=False)
    total = initializer_stats(plain)[1]
    assert step_weight_bytes(plain, total) == total
    every = initializer_stats(short)[1]  # the whole head and the factors
    assert step_weight_bytes(short, every) < min(every, total)  # the factors, 16 × (64 + 102), less than 86 rows of 64


def test_generate_reads_the_shortlist(folders, capsys):
    code, out, err = run_cli(
        capsys, "generate", folders / "int4-short", "--prompt", "the value of", "--max-new-tokens", 4
    )
    assert code == 0 and out.startswith("the value of"), err


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime_genai") is None, reason="needs onnxruntime-genai")
def test_genai_generates_what_we_generate_with_the_shortlist(folders):
    prompt, theirs = genai_greedy(folders / "int4-short", 12)
    graph = next((folders / "int4-short" / "onnx").glob("*.onnx"))
    assert theirs and decode_ids(make_session(graph), prompt, len(theirs)) == theirs


@pytest.mark.parametrize(
    ("model", "options", "said"),
    [
        ("bert", ["--shortlist", "8"], "is a causal LM's head"),
        ("fused", ["--shortlist", "0"], "counts ≥ 1"),
        ("fused", ["--shortlist-rank", "8"], "give --shortlist K with it"),
        ("fused", ["--shortlist", "102"], "no shorter than this LM's vocabulary of 102"),
        ("fused", ["--shortlist", "8", "--shortlist-rank", "64"], "not below this LM's hidden width 64"),
        ("fused", ["--shortlist", "8", "--quantize", "int8"], "--quantize int8's are not"),
        ("traced", ["--shortlist", "8", "--shortlist-rank", "8"], "fused decoder's head"),
    ],
)
def test_a_shortlist_the_model_cannot_take_is_refused(
    folders, tiny_bert_dir, tiny_llama_dir, tmp_path, capsys, model, options, said
):
    source = {"bert": tiny_bert_dir, "fused": folders / "llama", "traced": tiny_llama_dir}[model]
    code, _, err = run_cli(capsys, "export", source, "--out", tmp_path / "out", *options)
    assert code == 2 and said in err, err
    assert not (tmp_path / "out").exists()


def test_the_heads_fit_is_the_activation_aware_truncation_found_from_d_by_d_products():
    """head_fit's A B, its rows read a block at a time, is whitened_factors' rank-r fit of the same W and Gram."""
    import torch

    from compressor.lowrank import whitened_factors
    from converters.quantization.shortlist_head import head_fit

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((300, 24)) * np.linspace(3, 0.1, 24)  # V × D, a falling spectrum
    x = rng.standard_normal((500, 24)) @ rng.standard_normal((24, 24))
    gram = x.T @ x
    down, up = head_fit(lambda: (weight[i : i + 64] for i in range(0, 300, 64)), gram, 8)
    fit = whitened_factors(torch.from_numpy(weight), torch.from_numpy(gram), 8)
    theirs = (fit.up @ fit.down).numpy().T  # Wᵀ ≈ (up down)ᵀ
    assert down.shape == (24, 8) and up.shape == (8, 300)
    assert np.abs(down @ up - theirs).max() <= 1e-4 * np.abs(theirs).max()
    norms = np.linalg.norm(fit.down.numpy(), axis=1)  # the same split of Σ between the factors (up to signs)
    assert np.abs(np.linalg.norm(down, axis=0) - norms).max() <= 1e-4 * norms.max()
