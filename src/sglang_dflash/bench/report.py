"""Render results: text tables, the --json document, and a plain-text progress line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sglang_dflash.bench.stats import Best, Comparison, RequestRecord, Summary

SCHEMA = "sglang-dflash-bench/1"


@dataclass
class ConfigResult:
    """One configuration of the run: its sweep point, and why it failed if it did."""

    label: str
    point: dict[str, Any]
    url: str | None = None
    config: dict[str, Any] | None = None
    error: str | None = None
    log_tail: list[str] = field(default_factory=list)


def _f(x: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if x is None else f"{x * scale:.{digits}f}"


def _trio(a: float | None, b: float | None, c: float | None, scale: float, digits: int) -> str:
    return "/".join(_f(v, scale, digits) for v in (a, b, c))


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned first column, right-aligned others, widths from the content."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        return "  ".join(cells).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def summary_table(summaries: Sequence[Summary]) -> str:
    headers = ["config", "conc", "ok/n", "out tok/s", "latency p50/p90/p99 s",
               "TTFT p50/p90/p99/max ms", "ITL p50/p90/p99 ms", "under half %", "accept len",
               "accept rate"]
    rows = [[s.config, str(s.concurrency), f"{s.ok}/{s.requests}",
             _f(s.output_tokens_per_s, digits=1),
             _trio(s.latency_p50, s.latency_p90, s.latency_p99, 1.0, 3),
             _trio(s.ttft_p50, s.ttft_p90, s.ttft_p99, 1000.0, 1) + "/"
             + _f(s.ttft_max, 1000.0, 1),
             _trio(s.itl_p50, s.itl_p90, s.itl_p99, 1000.0, 2),
             _f(s.underfilled_share, 100.0, 0),
             _f(s.accept_length), _f(s.accept_rate, digits=3)] for s in summaries]
    return render_table(headers, rows)


def comparison_table(comparisons: Sequence[Comparison]) -> str:
    headers = ["config", "conc", "out tok/s x", "latency p50 x", "ITL p50 x", "accept len x"]
    rows = [[c.config, str(c.concurrency), _f(c.throughput_ratio), _f(c.latency_p50_ratio),
             _f(c.itl_p50_ratio), _f(c.accept_length_ratio)] for c in comparisons]
    return render_table(headers, rows)


def best_table(best: Sequence[Best]) -> str:
    """Per concurrency: the configuration with the highest output tok/s, and x the baseline."""
    headers = ["fastest config", "conc", "out tok/s", "x baseline", "of"]
    rows = [[b.config, str(b.concurrency), _f(b.output_tokens_per_s, digits=1),
             _f(b.throughput_ratio), str(b.candidates)] for b in best]
    return render_table(headers, rows)


def document(*, machine: dict[str, str], argv: Sequence[str], interrupted: bool, baseline: str,
             configs: Sequence[ConfigResult], summaries: Sequence[Summary],
             comparisons: Sequence[Comparison], records: Sequence[RequestRecord],
             best: Sequence[Best] = (), warmups: Sequence[Summary] = ()) -> dict:
    """The --json document: everything needed to recompute the tables, and where it ran."""
    return {
        "schema": SCHEMA,
        "machine": dict(machine),
        "argv": list(argv),
        "interrupted": interrupted,
        "baseline": baseline,
        "configs": [asdict(c) for c in configs],
        "summaries": [asdict(s) for s in summaries],
        "comparison": [asdict(c) for c in comparisons],
        "best": [asdict(b) for b in best],
        "records": [asdict(r) for r in records],
        "warmups": [asdict(w) for w in warmups],  # the unrecorded warm-up waves, per level
    }


def progress_line(label: str, done: int, total: int, elapsed: float, width: int = 24) -> str:
    """`label [#########-----] 34/100 12.3s`: plain ASCII, so any terminal shows it."""
    frac = 0.0 if total <= 0 else min(1.0, done / total)
    filled = round(frac * width)
    return f"{label} [{'#' * filled}{'-' * (width - filled)}] {done}/{total} {elapsed:.1f}s"
