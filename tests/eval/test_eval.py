import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from compressor.errors import CompressorError
from converters.checkpoint import load_model
from converters.export import export_onnx
from eval.benchmark import bench, parity_of
from eval.environment import file_sha256, integer_path, texts_sha256
from eval.graph import file_bytes, initializer_stats, load_graph, make_session, optimized_initializer_bytes
from eval.latency import MAX_ROUNDS, ROUNDS, latency_key, measure_latency, time_side_by_side
from eval.memory import peak_rss
from eval.probe import row_chunks, text_batch
from eval.quality import cosine_mean, recall_at_k
from eval.report import write_report
from texts.corpus import SECOND, passages, read_passages


@pytest.fixture(scope="module")
def tiny_onnx(tiny_bert_dir, tmp_path_factory):
    model, _ = load_model(tiny_bert_dir)
    return export_onnx(model, tmp_path_factory.mktemp("onnx") / "tiny.onnx").path


def unit_rows(n, d, seed):
    x = np.random.default_rng(seed).normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_identical_embeddings_agree_fully_and_random_ones_do_not():
    a, b = unit_rows(50, 8, 0), unit_rows(50, 8, 1)
    assert cosine_mean(a, a) == pytest.approx(1.0, abs=1e-6)
    assert recall_at_k(a, a, 10) == 1.0
    assert recall_at_k(a, b, 10) < 0.5
    assert abs(cosine_mean(a, b)) < 0.3


def test_recall_counts_shared_neighbours():
    a = unit_rows(30, 4, 0)
    assert recall_at_k(a, a * 2.0, 10) == 1.0  # a scale changes no neighbour


@pytest.mark.parametrize(
    "content, message", [(b"", "at least"), (b"\xff\xfe\x00bad", "not UTF-8"), (None, "does not exist")]
)
def test_bad_text_files_raise(tmp_path, content, message):
    path = tmp_path / "t.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(CompressorError, match=message):
        read_passages(path)


def test_sizes_and_initializers(tiny_onnx):
    elements, total = initializer_stats(load_graph(tiny_onnx))
    assert total >= 4 * elements > 0
    assert file_bytes(tiny_onnx) >= total
    assert 0 < optimized_initializer_bytes(tiny_onnx) <= 1.05 * file_bytes(tiny_onnx)
    assert parity_of(tiny_onnx) <= 1e-4


def test_sizes_of_a_graph_with_its_weights_beside_it(tiny_onnx, tmp_path):
    model = load_graph(tiny_onnx)
    path = tmp_path / "beside.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="beside.onnx.data", size_threshold=0)
    assert file_bytes(path) >= initializer_stats(model)[1] > path.stat().st_size  # the weights are beside it
    assert optimized_initializer_bytes(path) == pytest.approx(optimized_initializer_bytes(tiny_onnx), rel=0.05)


def test_latency_has_the_contract_keys(tiny_onnx):
    first, second = measure_latency([tiny_onnx] * 2, vocab=100, settings=((1, 16, 1), (2, 8, 2)), runs=3, warmup=1)
    assert set(first) == set(second)
    lat = second
    assert set(lat) == {latency_key(1, 16, 1), latency_key(2, 8, 2)} == {"b1_s16_t1", "b2_s8_t2"}
    assert all(0 < v["p50"] <= v["p90"] and ROUNDS <= len(v["p50_rounds"]) <= MAX_ROUNDS for v in lat.values())


def test_a_p50_is_the_median_of_three_benches_so_one_slow_spell_moves_one_of_them():
    from eval.latency import _percentiles

    rounds = [[1.0, 1.0, 10.0], [1.0, 1.0, 10.0], [10.0, 10.0, 10.0]]  # the whole third bench in a slow spell
    figures = _percentiles(rounds)
    assert figures["p50_rounds"] == [1.0, 1.0, 10.0] and figures["p50"] == 1.0  # all nine runs' median: 10
    assert figures["p90"] == 10.0


@pytest.mark.parametrize("slow_spell, benches", [(False, ROUNDS), (True, MAX_ROUNDS)])
def test_more_benches_while_a_graphs_p50s_spread_wider_than_the_run_can_read(monkeypatch, slow_spell, benches):
    """ROUNDS benches where they agree; while one graph's spread is past WIDE_SPREAD, more, up to MAX_ROUNDS."""
    import eval.latency as latency

    calls = {"steady": 0, "spelled": 0}

    def timed(session, feed, runs):
        calls[session] += runs
        slow = slow_spell and session == "spelled" and calls[session] <= 4  # its first bench in a slow spell
        return [2.0 if slow else 1.0] * runs

    monkeypatch.setattr(latency, "_timed", timed)
    monkeypatch.setattr(latency, "full_feed", lambda session, feed: feed)
    steady, spelled = time_side_by_side(["steady", "spelled"], {}, runs=15, warmup=0, per_turn=2)
    assert len(steady["p50_rounds"]) == len(spelled["p50_rounds"]) == benches
    assert spelled["p50"] == 1.0 and max(spelled["p50_rounds"]) == (2.0 if slow_spell else 1.0)


def test_text_batches_are_consecutive_windows_of_the_stream():
    stream = np.arange(10, 40)
    feed = text_batch(stream, 2, 8)
    assert feed["input_ids"].dtype == np.int64 and feed["attention_mask"].tolist() == [[1] * 8] * 2
    assert feed["input_ids"].tolist() == [list(range(10, 18)), list(range(18, 26))]
    short = text_batch(np.array([3, 4, 5]), 2, 4)["input_ids"]  # repeated to fill the batch
    assert short.tolist() == [[3, 4, 5, 3], [4, 5, 3, 4]]
    with pytest.raises(ValueError, match="at least one token"):
        text_batch(np.array([], dtype=np.int64), 1, 4)


def test_latency_runs_on_the_token_stream_it_is_given(tiny_onnx):
    settings = dict(vocab=100, settings=((2, 8, 1),), runs=2, warmup=1)
    (lat,) = measure_latency([tiny_onnx], **settings, stream=np.arange(5))
    assert 0 < lat["b2_s8_t1"]["p50"] <= lat["b2_s8_t1"]["p90"]
    with pytest.raises(Exception, match="out of|bounds|indices"):  # the stream's ids, not random ones, are fed
        measure_latency([tiny_onnx], **settings, stream=np.array([10**6]))


@pytest.mark.memory
def test_peak_rss_counts_the_model(tiny_onnx):
    rss = peak_rss(tiny_onnx, vocab=100, batch=2, seq=16)
    assert rss["peak_rss_bytes"] > rss["baseline_rss_bytes"] > 10 * 2**20
    stages = rss["rss_stages"]
    assert list(stages) == ["session", "b1_s16", "b2_s16"]  # after the session is made, then after each batch
    peaks = [stage["peak_bytes"] for stage in stages.values()]
    assert peaks == sorted(peaks) and peaks[-1] == rss["peak_rss_bytes"]  # a peak so far never falls
    assert all(0 < stage["rss_bytes"] <= stage["peak_bytes"] for stage in stages.values())


@pytest.mark.parametrize("content", [b"", b"not an onnx model at all"])
def test_a_file_that_is_not_onnx_raises(tmp_path, content):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content + b"\x00\x01\x02")
    with pytest.raises(CompressorError, match="not an ONNX model|cannot load"):
        load_graph(path)
    with pytest.raises(CompressorError):
        make_session(path)


@pytest.fixture(scope="module")
def other_onnx(tiny_bert_dir, tmp_path_factory):
    """The tiny BERT with every weight perturbed by 30 %: it agrees with tiny_onnx only partly."""
    model, _ = load_model(tiny_bert_dir)
    torch.manual_seed(1)
    with torch.no_grad():
        for weight in model.parameters():
            weight.mul_(1 + 0.3 * torch.randn_like(weight))
    return export_onnx(model, tmp_path_factory.mktemp("onnx") / "other.onnx").path


def test_a_row_onnx_runtime_cannot_run_is_left_out_and_said(
    tiny_onnx, other_onnx, tiny_bert_dir, eval_text_file, monkeypatch, capsys
):
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    from eval import benchmark
    from eval.report import markdown_table

    opened = benchmark.numbers_session

    def session(path):
        if Path(path) == Path(other_onnx):
            raise Fail("Shape mismatch attempting to re-use buffer. {1,1,511,256} != {1,1,512,256}")
        return opened(path)

    monkeypatch.setattr(benchmark, "numbers_session", session)
    variants = [("original", tiny_onnx), ("broken", other_onnx), ("same", tiny_onnx)]
    texts = read_passages(eval_text_file)
    report = bench(variants, tiny_bert_dir, texts, "t", "tiny", runs=2, settings=((1, 16, 1),), progress=False)
    assert [v["name"] for v in report["variants"]] == ["original", "same"]  # measured: the rows that ran
    assert report["failed"] == [
        {
            "name": "broken",
            "onnx_path": str(other_onnx),
            "error": "ONNX Runtime could not run it: Shape mismatch attempting to re-use buffer. {1,1,511,256} != "
            "{1,1,512,256}",
        }
    ]
    assert "bench: broken left out of the report" in capsys.readouterr().err
    assert "left out: **broken**" in markdown_table(report)


def test_bench_report_follows_the_contract(tiny_onnx, other_onnx, tiny_bert_dir, eval_text_file, tmp_path):
    texts = read_passages(eval_text_file)
    second_texts, second_where = passages(None, SECOND)
    report = bench(
        [("original", tiny_onnx), ("same", tiny_onnx), ("other", other_onnx)],
        tiny_bert_dir,
        texts,
        "test text",
        "tiny",
        second_texts=second_texts[:40],
        second_text=second_where,
        runs=2,
        settings=((1, 16, 1),),
        rss_shape=(2, 16),
        progress=False,
    )
    first, second, other = report["variants"]
    assert first["name"] == "original"
    for key in (
        "onnx_path",
        "params",
        "file_bytes",
        "optimized_initializer_bytes",
        "peak_rss_bytes",
        "baseline_rss_bytes",
        "latency_ms",
        "quality",
        "parity_max_abs",
    ):
        assert key in second
    assert second["quality"] == second["quality_second_text"] == {"cosine_mean": 1.0, "recall_at_10": 1.0}
    assert report["second_text"] == f"{second_where}, 40 passages" and "Lee corpus" in second_where
    assert set(other["quality_second_text"]) == set(other["quality"])
    assert other["quality_second_text"] != other["quality"]  # measured on the other text
    fronts = [{cost: row["pareto"][cost] for cost in ("file_bytes", "latency")} for row in (first, second)]
    assert fronts[0] == fronts[1] == {"file_bytes": True, "latency": False}  # a tie; (8, 128) not timed
    assert set(first["pareto"]) == {"file_bytes", "latency", "memory"}  # memory's: two measures of one graph
    assert first["sha256"] == second["sha256"] == file_sha256(tiny_onnx) != other["sha256"]
    env = report["environment"]
    assert env["integer_path"] == integer_path() and env["onnxruntime"] == onnxruntime.__version__
    assert env["texts"] == {"eval": texts_sha256(texts), "second": texts_sha256(second_texts[:40])}
    assert report["run"]["date"][:4].isdigit() and "command" in report["run"]
    json_path, md_path = write_report(report, tmp_path / "report.json")
    assert json.loads(json_path.read_text()) == report
    table = md_path.read_text()
    assert "| same |" in table
    assert "| recall_at_10 | cosine_mean (2nd) | recall_at_10 (2nd) |" in table
    assert f"(2nd) on: {report['second_text']}" in table
    assert "on the size front: **same** 1.000× file size, recall_at_10 1.000 (eval text) / 1.000 (2nd text)" in table
    assert report["latency_input"] in table and "eval text" in report["latency_input"]


def test_bench_takes_the_second_text_with_its_name(tiny_onnx, tiny_bert_dir):
    with pytest.raises(CompressorError, match="together"):
        bench([("original", tiny_onnx)], tiny_bert_dir, ["a b"], "t", "tiny", second_texts=["a b"])


class _Outputs:
    """A session stand-in whose first output is (batch, sequence, width)."""

    def __init__(self, width):
        self.width = width

    def get_outputs(self):
        return [type("Output", (), {"shape": ["batch", "sequence", self.width]})()]


def test_row_blocks_cut_rows_within_the_limit_in_order_and_no_rows_as_one_empty_block():
    from eval.probe import row_blocks

    y, z = np.arange(70.0).reshape(7, 10), -np.arange(70.0).reshape(7, 10)
    blocks = list(row_blocks(y, z, limit=3 * 10 * 8))
    assert [len(a) for a, _ in blocks] == [3, 3, 1]
    np.testing.assert_array_equal(np.concatenate([a for a, _ in blocks]), y)
    np.testing.assert_array_equal(np.concatenate([b for _, b in blocks]), z)
    assert [len(a) for (a,) in row_blocks(y, limit=1)] == [1] * 7  # one row at least
    assert [a.shape for (a,) in row_blocks(np.zeros((0, 10)))] == [(0, 10)]


def test_row_chunks_cut_a_batch_in_whole_rows_within_the_limit_in_order():
    feed = {"input_ids": np.arange(80).reshape(10, 8), "attention_mask": np.ones((10, 8), np.int64)}
    limit = 3 * 8 * 1000 * 4  # three rows of a 1,000-wide float output
    chunks = list(row_chunks(_Outputs(1000), feed, limit))
    assert [len(c["input_ids"]) for c in chunks] == [3, 3, 3, 1]
    for name in feed:
        np.testing.assert_array_equal(np.concatenate([c[name] for c in chunks]), feed[name])
    assert [len(c["input_ids"]) for c in row_chunks(_Outputs(10**9), feed, limit)] == [1] * 10  # one row at least
    assert len(list(row_chunks(_Outputs("width"), feed, limit))) == 1  # a width the graph does not fix: whole


@pytest.mark.parametrize("scheme", [None, "int8", "int4"])
def test_the_optimized_graph_is_written_before_the_kernels_pack_their_weights(tiny_bert_graph, tmp_path, scheme):
    from converters.quantization.quantize import quantize_onnx
    from converters.quantization.registry import scheme_named

    fp32, vocab, _ = tiny_bert_graph
    path = fp32
    if scheme is not None:
        path = quantize_onnx(fp32, tmp_path / "q.onnx", scheme_named(scheme)(), vocab=vocab).path
    packed = onnxruntime.SessionOptions()
    packed.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    packed.optimized_model_filepath = str(tmp_path / "packed.onnx")
    onnxruntime.InferenceSession(str(path), packed, providers=["CPUExecutionProvider"])
    make_session(path, optimized_path=tmp_path / "unpacked.onnx")  # its kernels pack nothing: less memory

    def weights(p):
        return {i.name: (i.data_type, tuple(i.dims)) for i in load_graph(p, with_data=False).graph.initializer}

    assert weights(tmp_path / "packed.onnx") == weights(tmp_path / "unpacked.onnx")


@pytest.mark.parametrize("scheme", [None, "int8", "int4"])
def test_a_session_for_numbers_packs_the_weights_of_a_quantized_graph_only_and_gives_the_same_outputs(
    tiny_bert_graph, tmp_path, scheme
):
    from converters.quantization.quantize import quantize_onnx
    from converters.quantization.registry import scheme_named
    from eval.graph import numbers_session

    fp32, vocab, _ = tiny_bert_graph
    path = fp32
    if scheme is not None:
        path = quantize_onnx(fp32, tmp_path / "q.onnx", scheme_named(scheme)(), vocab=vocab).path
    session, timed = numbers_session(path), make_session(path, threads=2)
    options = session.get_session_options()
    if scheme is None:
        assert options.get_session_config_entry("session.disable_prepacking") == "1"
    else:  # its 4- and 8-bit kernels keep their packed weights (unpacked, they repack at every call)
        with pytest.raises(RuntimeError, match="does not have configuration"):
            options.get_session_config_entry("session.disable_prepacking")
    ids = np.arange(1, 17, dtype=np.int64).reshape(2, 8) % vocab
    feed = {i.name: ids if i.name == "input_ids" else np.ones_like(ids) for i in session.get_inputs()}
    np.testing.assert_allclose(session.run(None, feed)[0], timed.run(None, feed)[0], rtol=1e-4, atol=1e-4)
