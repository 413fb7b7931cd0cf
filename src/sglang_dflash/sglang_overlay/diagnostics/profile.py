"""Per-round stage timing of the DDTree worker, off unless an env var names a file.

``SGLANG_DFLASH_DDTREE_PROFILE=<path.jsonl>`` switches it on in the scheduler process. Each
decode round records six events on the current stream (round start, after draft, after tree
build, after verify preparation, after target verify, after accept/commit) into a preallocated
ring of ``every`` slots (``SGLANG_DFLASH_DDTREE_PROFILE_EVERY``, default 64). Only when the
ring is full does the host wait, once, on the last event; it then reads all elapsed times and
appends one JSON line per batch size seen in that window. No per-round host sync; when the
variable is unset the worker holds ``None`` and pays one ``is not None`` test per mark.

What the numbers mean: GPU-stream time between marks. A stage whose host code syncs or launches
slowly includes the stream's idle gap in that stage (the TEST-ONLY plant runs in ``draft``
without a host sync; one there would show as ``draft`` time).

Stages: ``draft`` = draft block forward + top-K head (+ plant); ``tree`` = build_tree alone (the
DDTree builder, meant to cost under 5% of a verify); ``prep`` = verify cache
slots, verify tensors (FULL_MASK) and the verify batch's attention metadata (DFLASH pays a
linear-mask version of this too); ``verify`` = target TARGET_VERIFY forward and
logits adjustments; ``commit`` = per-node choice, tree walk, KV move, drafter KV commit.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_dflash.sglang_overlay import settings
from sglang_dflash.sglang_overlay.timing import HostEvent

PROFILE_ENV = settings.PROFILE_ENV
EVERY_ENV = settings.PROFILE_EVERY_ENV
STAGES = ("draft", "tree", "prep", "verify", "commit")
MARKS = len(STAGES) + 1
DEFAULT_EVERY = 64


@dataclass(frozen=True)
class RoundTimes:
    """One round: batch size and milliseconds per stage, in STAGES order."""

    bs: int
    ms: tuple[float, ...]


def stage_ms(events: Sequence[Any]) -> tuple[float, ...]:
    """Per-stage ms of one round's MARKS events (``a.elapsed_time(b)`` = ms from a to b)."""
    return tuple(events[i].elapsed_time(events[i + 1]) for i in range(len(STAGES)))


def summarize(rounds: Sequence[RoundTimes], *, window: int, extra: Mapping[str, Any]) -> list[dict]:
    """One JSON-ready record per batch size: rounds, bs, mean/p50 ms per stage and in total."""
    by_bs: dict[int, list[RoundTimes]] = {}
    for r in rounds:
        by_bs.setdefault(r.bs, []).append(r)
    out = []
    for bs in sorted(by_bs):
        group = by_bs[bs]
        ms: dict[str, dict[str, float]] = {}
        columns = [[r.ms[i] for r in group] for i in range(len(STAGES))]
        columns.append([sum(r.ms) for r in group])
        for name, col in zip((*STAGES, "total"), columns, strict=True):
            ms[name] = {
                "mean": round(statistics.fmean(col), 4),
                "p50": round(statistics.median(col), 4),
            }
        out.append({**extra, "window": window, "rounds": len(group), "bs": bs, "ms": ms})
    return out


def positive_int_or(raw: str | None, default: int) -> int:
    """An env value as a positive int; missing or bad gives ``default`` (a measurement aid's
    setting must never fail the server)."""
    try:
        value = int((raw or "").strip())
    except ValueError:
        return default
    return value if value >= 1 else default


def parse_every(raw: str | None) -> int:
    """Rounds per flush (SGLANG_DFLASH_DDTREE_PROFILE_EVERY)."""
    return positive_int_or(raw, DEFAULT_EVERY)


class RoundProfiler:
    """A ring of ``every`` rounds x MARKS events; flushed to a JSON-lines file when full."""

    def __init__(
        self,
        path: str | Path,
        *,
        every: int = DEFAULT_EVERY,
        event_factory: Callable[[], Any] = HostEvent,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self.every = every
        self.extra = dict(extra or {})
        self._events = [[event_factory() for _ in range(MARKS)] for _ in range(every)]
        self._bs = [0] * every
        self._slot = 0
        self._window = 0
        self.error: str | None = None

    def mark(self, i: int, bs: int | None = None) -> None:
        """Record mark ``i`` (0 = round start ... MARKS-1 = round end) of the current round.

        A failing flush (unwritable file, ...) switches profiling off and keeps the reason in
        ``error``: a measurement aid must never take the server down.
        """
        if self.error is not None:
            return
        self._events[self._slot][i].record()
        if bs is not None:
            self._bs[self._slot] = bs
        if i == MARKS - 1:
            self._slot += 1
            if self._slot == self.every:
                try:
                    self.flush()
                except Exception as exc:
                    self.error = f"{type(exc).__name__}: {exc}"

    def flush(self) -> list[dict]:
        """Read the filled slots (one host wait) and append their summary lines."""
        n = self._slot
        self._slot = 0
        if n == 0:
            return []
        self._events[n - 1][MARKS - 1].synchronize()
        rounds = []
        for s in range(n):
            rounds.append(RoundTimes(self._bs[s], stage_ms(self._events[s])))
        records = summarize(rounds, window=self._window, extra=self.extra)
        self._window += 1
        with self.path.open("a", encoding="utf-8") as fh:
            for rec in records:
                fh.write(json.dumps(rec) + "\n")
        return records


def from_env(
    environ: Mapping[str, str] | None = None,
    *,
    event_factory: Callable[[], Any] = HostEvent,
    extra: Mapping[str, Any] | None = None,
) -> RoundProfiler | None:
    """The profiler the env asks for, or None (the default: zero cost)."""
    env = os.environ if environ is None else environ
    path = env.get(PROFILE_ENV, "").strip()
    if not path:
        return None
    return RoundProfiler(
        path, every=parse_every(env.get(EVERY_ENV)), event_factory=event_factory, extra=extra
    )
