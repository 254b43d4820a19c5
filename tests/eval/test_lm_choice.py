"""An LM report's row to deploy (eval.lm_choice): the fastest decoding of the rows whose perplexity stays within
the slack of the original's on both texts."""

from eval.goals import choose


def _row(name: str, ms: float, ppl: float, ppl_2nd: float, file: float = 1e8, rss: float = 1e9, **extra) -> dict:
    decode = {f"ctx{c}": {"per_token_p50_ms": ms, "tokens_per_s": 1e3 / ms} for c in (128, 512)}
    quality = {"perplexity": ppl, "top1_agreement": 0.9}
    return {
        "name": name,
        "decode_ms": decode,
        "file_bytes": file,
        "peak_rss_bytes": rss,
        "quality": quality,
        "quality_second_text": {**quality, "perplexity": ppl_2nd},
        **extra,
    }


ROWS = [
    _row("original", 40.0, 20.0, 30.0, file=1e9),
    _row("original-int8", 20.0, 40.0, 60.0, file=3e8),  # fast, but its perplexity doubles
    _row("original-w8", 21.0, 20.2, 30.3, file=3e8),
    _row("original-int4", 12.0, 21.0, 34.0, file=1.5e8),  # within 10 % on the eval text, not on the second
    _row("original-int4-aware", 13.0, 21.0, 32.0, file=1.6e8),
    _row("original-int4-fast", 9.0, 20.5, 30.5, gate_failed="off"),  # off its gate: never chosen
]


def test_the_fastest_row_within_the_perplexity_bound_on_both_texts_is_deployed():
    chosen = choose({"variants": ROWS})
    assert chosen["row"] == "original-int4-aware" and chosen["against"] == "original"
    assert "13.00 ms a token (0.33× original's)" in chosen["why"]


def test_other_goals_read_other_figures_under_the_same_bound():
    assert choose({"variants": ROWS}, "size")["row"] == "original-int4-aware"
    assert choose({"variants": ROWS}, "quality")["row"] == "original-w8"


def test_no_row_within_the_bound_deploys_nothing():
    chosen = choose({"variants": [ROWS[0], ROWS[1]]})
    assert chosen["row"] is None and "within 10%" in chosen["why"]
