"""Statistics: percentiles, per-token ITL, acceptance aggregation, summaries, ratios."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_dflash.bench.stats import (
    RequestRecord,
    accept_stats,
    compare,
    itl_samples,
    percentile,
    ratio,
    summarize,
    underfilled_share,
)


def rec(**kw) -> RequestRecord:
    base = dict(config="a", concurrency=1, prompt_index=0, ok=True)
    return RequestRecord(**{**base, **kw})


def test_percentile_interpolates_linearly():
    xs = [10.0, 20.0, 30.0, 40.0]
    assert percentile(xs, 0) == 10.0
    assert percentile(xs, 100) == 40.0
    assert percentile(xs, 50) == pytest.approx(25.0)
    assert percentile(xs, 90) == pytest.approx(37.0)  # pos 2.7 -> 30 + 0.7*10
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) is None


def test_percentile_ignores_input_order_and_rejects_bad_q():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    with pytest.raises(ValueError):
        percentile([1.0], 101)


@given(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=50))
def test_percentile_matches_statistics_inclusive(xs):
    # statistics.quantiles(method="inclusive") is the same linear interpolation.
    qs = statistics.quantiles(xs, n=10, method="inclusive")
    for i, q in enumerate(qs, 1):
        assert percentile(xs, i * 10) == pytest.approx(q, rel=1e-9, abs=1e-6)


def test_itl_counts_speculative_steps_per_token():
    # first tokens at 0.1 s (TTFT, no gap); then +3 tokens after 0.3 s; a metadata-only
    # chunk (no new tokens) at 0.5 s; then +1 token at 0.6 s.
    chunks = [(0.1, 1), (0.4, 4), (0.5, 4), (0.6, 5)]
    assert itl_samples(chunks) == pytest.approx([0.1, 0.1, 0.1, 0.2])
    assert itl_samples([]) == []
    assert itl_samples([(0.2, 0), (0.3, 2)]) == []  # an empty first chunk is not a token


def test_accept_stats_weights_by_verify_steps():
    rs = [rec(output_tokens=30, spec_verify_ct=10, spec_accept_rate=0.2, spec_accept_length=3.0),
          rec(output_tokens=10, spec_verify_ct=10, spec_accept_rate=0.0, spec_accept_length=1.0)]
    length, rate = accept_stats(rs)
    assert length == pytest.approx(40 / 20)
    assert rate == pytest.approx(0.1)


def test_accept_stats_falls_back_to_mean_and_skips_failures():
    rs = [rec(spec_accept_length=2.0), rec(spec_accept_length=4.0, spec_accept_rate=0.5),
          rec(ok=False, spec_accept_length=100.0)]
    assert accept_stats(rs) == (pytest.approx(3.0), pytest.approx(0.5))
    assert accept_stats([rec()]) == (None, None)


def test_summarize_counts_only_successes_in_throughput():
    rs = [rec(latency=1.0, ttft=0.1, output_tokens=100, itl=[0.01, 0.02]),
          rec(latency=3.0, ttft=0.3, output_tokens=100, itl=[0.03]),
          rec(ok=False, error="timed out")]
    s = summarize("a", 4, rs, duration_s=4.0)
    assert (s.requests, s.ok, s.errors) == (3, 2, 1)
    assert s.output_tokens == 200
    assert s.output_tokens_per_s == pytest.approx(50.0)
    assert s.requests_per_s == pytest.approx(0.5)
    assert s.latency_p50 == pytest.approx(2.0)
    assert s.ttft_p90 == pytest.approx(0.28)
    assert s.itl_p50 == pytest.approx(0.02)
    assert s.accept_length is None


def test_underfilled_share_finds_requests_queued_behind_a_wave():
    # c = 4 for 10 s: four requests 0-5 s, four 5-10 s: always full
    full = [rec(start=s, latency=5.0) for s in (0, 0, 0, 0, 5, 5, 5, 5)]
    assert underfilled_share(full, 4, 10.0) == pytest.approx(0.0)
    # H200 §37's shape: one request of the second wave starts a second late and runs alone at
    # the end: under half full (fewer than 2 in flight) from 10 s to 11 s
    stalled = [rec(start=s, latency=5.0) for s in (0, 0, 0, 0, 5, 5, 5)] + [
        rec(start=6.0, latency=5.0)]
    assert underfilled_share(stalled, 4, 11.0) == pytest.approx(1.0 / 11.0)
    # a request with no latency (failed) stays in flight to the end; an empty level is None
    assert underfilled_share([rec(start=0.0, latency=None)] * 2, 4, 2.0) == pytest.approx(0.0)
    assert underfilled_share([], 4, 1.0) is None and underfilled_share(full, 4, 0.0) is None
    s = summarize("a", 4, stalled, duration_s=11.0)
    assert s.underfilled_share == pytest.approx(1.0 / 11.0)


def test_summarize_reports_the_longest_wait_for_a_first_token():
    s = summarize("a", 2, [rec(latency=1.0, ttft=0.1), rec(latency=2.0, ttft=1.5),
                           rec(ok=False, ttft=9.0, error="x")], duration_s=2.0)
    assert s.ttft_max == pytest.approx(1.5)  # failed requests do not count
    assert summarize("a", 1, [rec(ok=False, error="x")], 1.0).ttft_max is None


def test_summarize_all_failed_has_no_rates():
    s = summarize("a", 1, [rec(ok=False, error="x")], duration_s=1.0)
    assert s.output_tokens_per_s is None and s.latency_p50 is None and s.errors == 1


def test_ratio_and_compare_against_baseline_per_concurrency():
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None and ratio(1.0, 0.0) is None
    base1 = summarize("base", 1, [rec(latency=2.0, output_tokens=100)], 1.0)
    base8 = summarize("base", 8, [rec(latency=4.0, output_tokens=400)], 1.0)
    new1 = summarize("new", 1, [rec(latency=1.0, output_tokens=124)], 1.0)
    new32 = summarize("new", 32, [rec(latency=1.0, output_tokens=1)], 1.0)
    cs = {(c.config, c.concurrency): c for c in compare([base1, base8, new1, new32], "base")}
    assert cs[("new", 1)].throughput_ratio == pytest.approx(1.24)
    assert cs[("new", 1)].latency_p50_ratio == pytest.approx(0.5)
    assert cs[("base", 8)].throughput_ratio == pytest.approx(1.0)
    assert cs[("new", 32)].throughput_ratio is None  # no baseline at that level
