"""One whole run on the real default model (all-MiniLM-L6-v2), small settings."""

import json

import pytest

from converters.cli import main

pytestmark = pytest.mark.slow


def test_run_on_the_default_model(tmp_path, monkeypatch):
    monkeypatch.setattr("eval.benchmark.SETTINGS", ((1, 16, 1),))
    out = tmp_path / "run"
    argv = ["run", "--rank", "16", "--eval-passages", "32", "--runs", "1", "--out", str(out)]
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    original, int8, tt = report["variants"]
    assert report["model"] == "all-MiniLM-L6-v2"
    assert [v["name"] for v in report["variants"]] == ["original", "original-int8", "tt-r16-pca"]
    assert int8["file_bytes"] <= 0.26 * original["file_bytes"]  # the one-liner: per-channel int8, table and all
    assert original["params"] > 22_000_000
    assert max(original["parity_max_abs"], tt["parity_max_abs"]) <= 1e-4
    assert tt["file_bytes"] <= 0.52 * original["file_bytes"]
    assert tt["optimized_initializer_bytes"] <= 1.05 * tt["file_bytes"]  # no core product folded
    assert set(tt["latency_ms"]) == {"b1_s16_t1"}
    assert original["quality"] == {"cosine_mean": 1.0, "recall_at_10": 1.0}
    assert 0.0 < tt["quality"]["cosine_mean"] < 0.99  # the variant, not the original compared with itself
