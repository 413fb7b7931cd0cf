"""Per-request records and the statistics computed from them; pure functions only."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    """What one /generate request did; times are seconds, relative to the level's start."""

    config: str
    concurrency: int
    prompt_index: int
    ok: bool
    start: float = 0.0
    latency: float | None = None
    ttft: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None
    # Per-token gaps between streamed chunks: a chunk that commits k tokens after a gap g
    # contributes k samples of g/k, so speculative steps are counted per token.
    itl: list[float] = field(default_factory=list)
    spec_accept_length: float | None = None
    spec_accept_rate: float | None = None
    spec_verify_ct: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class Summary:
    """One configuration at one concurrency level."""

    config: str
    concurrency: int
    requests: int
    ok: int
    errors: int
    duration_s: float
    output_tokens: int
    output_tokens_per_s: float | None
    requests_per_s: float | None
    latency_p50: float | None
    latency_p90: float | None
    latency_p99: float | None
    ttft_p50: float | None
    ttft_p90: float | None
    ttft_p99: float | None
    itl_p50: float | None
    itl_p90: float | None
    itl_p99: float | None
    accept_length: float | None
    accept_rate: float | None
    # the longest wait for a first token, and the share of the level's wall time with fewer than
    # half of ``concurrency`` requests in flight: a server that queues some requests behind a
    # whole wave shows here where percentiles hide it (H200 §37: absent c = 64, 3 of 256
    # requests waited 1.5 s; 19 % of the level under half full, no speculation 2 %)
    ttft_max: float | None = None
    underfilled_share: float | None = None


def underfilled_share(records: Sequence[RequestRecord], concurrency: int,
                      duration_s: float) -> float | None:
    """Share of [0, duration_s] during which fewer than concurrency / 2 of ``records`` were in
    flight (a request is in flight from its start to start + latency; one without a latency
    until the end). None for an empty level or no duration."""
    if not records or duration_s <= 0:
        return None
    events: list[tuple[float, int]] = []
    for r in records:
        start = min(max(r.start, 0.0), duration_s)
        end = duration_s if r.latency is None else min(max(r.start + r.latency, start), duration_s)
        events += [(start, 1), (end, -1)]
    events.sort()  # by time; at one instant an end (-1) before a start (+1)
    low, inflight, last = 0.0, 0, 0.0
    for t, d in events:
        if 2 * inflight < concurrency:
            low += t - last
        inflight, last = inflight + d, t
    if 2 * inflight < concurrency:
        low += duration_s - last
    return low / duration_s


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation, as numpy's default; None if empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in 0..100, got {q}")
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def itl_samples(chunks: Iterable[tuple[float, int]]) -> list[float]:
    """Per-token inter-token latencies from (arrival time, cumulative tokens) of streamed chunks.

    The first chunk that carries tokens defines the time to first token, not a gap; chunks
    that add no tokens (metadata only) are skipped without resetting the clock.
    """
    out: list[float] = []
    last_t: float | None = None
    last_n = 0
    for t, n in chunks:
        added = n - last_n
        if added <= 0:
            continue
        if last_t is not None:
            out.extend([(t - last_t) / added] * added)
        last_t, last_n = t, n
    return out


def accept_stats(records: Sequence[RequestRecord]) -> tuple[float | None, float | None]:
    """Acceptance length and rate over requests, weighted by verify steps.

    Length is committed tokens per verify step (sum of tokens / sum of steps) when the
    server reports steps; otherwise the mean of the reported lengths. Rate is weighted by
    steps too, so a long request counts more than a short one, as on the server.
    """
    with_ct = [r for r in records if r.ok and r.spec_verify_ct]
    if with_ct:
        steps = sum(r.spec_verify_ct or 0 for r in with_ct)
        length = sum(r.output_tokens for r in with_ct) / steps
        rated = [r for r in with_ct if r.spec_accept_rate is not None]
        rate_steps = sum(r.spec_verify_ct or 0 for r in rated)
        rate = (
            sum((r.spec_accept_rate or 0.0) * (r.spec_verify_ct or 0) for r in rated) / rate_steps
            if rated
            else None
        )
        return length, rate
    lengths = [r.spec_accept_length for r in records if r.ok and r.spec_accept_length is not None]
    rates = [r.spec_accept_rate for r in records if r.ok and r.spec_accept_rate is not None]
    return (
        sum(lengths) / len(lengths) if lengths else None,
        sum(rates) / len(rates) if rates else None,
    )


def summarize(
    config: str, concurrency: int, records: Sequence[RequestRecord], duration_s: float
) -> Summary:
    """Aggregate one level. Throughput counts only successful requests over the wall time."""
    ok = [r for r in records if r.ok]
    lat = [r.latency for r in ok if r.latency is not None]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [x for r in ok for x in r.itl]
    tokens = sum(r.output_tokens for r in ok)
    length, rate = accept_stats(records)
    rate_of = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: None)
    return Summary(
        config=config,
        concurrency=concurrency,
        requests=len(records),
        ok=len(ok),
        errors=len(records) - len(ok),
        duration_s=duration_s,
        output_tokens=tokens,
        output_tokens_per_s=rate_of(tokens) if ok else None,
        requests_per_s=rate_of(len(ok)) if ok else None,
        latency_p50=percentile(lat, 50),
        latency_p90=percentile(lat, 90),
        latency_p99=percentile(lat, 99),
        ttft_p50=percentile(ttft, 50),
        ttft_p90=percentile(ttft, 90),
        ttft_p99=percentile(ttft, 99),
        itl_p50=percentile(itl, 50),
        itl_p90=percentile(itl, 90),
        itl_p99=percentile(itl, 99),
        accept_length=length,
        accept_rate=rate,
        ttft_max=max(ttft) if ttft else None,
        underfilled_share=underfilled_share(records, concurrency, duration_s),
    )


@dataclass(frozen=True)
class Comparison:
    """A configuration against the baseline at the same concurrency; ratios are x/baseline."""

    config: str
    concurrency: int
    baseline: str
    throughput_ratio: float | None
    latency_p50_ratio: float | None
    itl_p50_ratio: float | None
    accept_length_ratio: float | None


def ratio(x: float | None, base: float | None) -> float | None:
    """x / base, or None when either is missing or the base is zero."""
    if x is None or base is None or base == 0:
        return None
    return x / base


def compare(summaries: Sequence[Summary], baseline: str) -> list[Comparison]:
    """Each summary against the baseline's summary at the same concurrency (if it has one)."""
    base = {s.concurrency: s for s in summaries if s.config == baseline}
    out = []
    for s in summaries:
        b = base.get(s.concurrency)
        out.append(
            Comparison(
                config=s.config,
                concurrency=s.concurrency,
                baseline=baseline,
                throughput_ratio=ratio(s.output_tokens_per_s, b and b.output_tokens_per_s),
                latency_p50_ratio=ratio(s.latency_p50, b and b.latency_p50),
                itl_p50_ratio=ratio(s.itl_p50, b and b.itl_p50),
                accept_length_ratio=ratio(s.accept_length, b and b.accept_length),
            )
        )
    return out


@dataclass(frozen=True)
class Best:
    """The fastest configuration at one concurrency level, among those with no failed request."""

    concurrency: int
    config: str
    output_tokens_per_s: float
    throughput_ratio: float | None  # against the baseline at this level; None without one
    candidates: int  # configurations that qualified at this level


def best_per_concurrency(summaries: Sequence[Summary], baseline: str) -> list[Best]:
    """Highest output tok/s per level (first in run order on a tie), ascending by concurrency.

    A configuration with any failed request at a level is not a candidate there: its
    throughput counts only what completed and would recommend a broken setting.
    """
    base = {s.concurrency: s for s in summaries if s.config == baseline}
    by_level: dict[int, list[Summary]] = {}
    for s in summaries:
        if s.errors == 0 and s.ok > 0 and s.output_tokens_per_s is not None:
            by_level.setdefault(s.concurrency, []).append(s)
    out = []
    for level in sorted(by_level):
        group = by_level[level]
        top = max(group, key=lambda s: s.output_tokens_per_s or 0.0)  # max keeps the first
        b = base.get(level)
        out.append(
            Best(
                concurrency=level,
                config=top.config,
                output_tokens_per_s=top.output_tokens_per_s or 0.0,
                throughput_ratio=ratio(top.output_tokens_per_s, b and b.output_tokens_per_s),
                candidates=len(group),
            )
        )
    return out
