"""First-round tracing of the DDTree worker: torch.profiler around the first decode round of
each new batch size, off unless an env var names a directory.

Why: the per-round profiler (profile.py) records 34-98 ms one-offs in `prep` the first time a
batch size reaches a server process with FlashInfer attention (docs/gpu-results.md §17), but
stage timing cannot say which call pays them. A profiler table of exactly those rounds can.

``SGLANG_DFLASH_DDTREE_TRACE=<dir>`` (scheduler process, TP rank 0) traces the first round of
each batch size, up to ``SGLANG_DFLASH_DDTREE_TRACE_MAX`` sizes (default 8), and writes per
traced round ``round-bs<bs>.txt`` (torch.profiler's key_averages table, top ops by self CPU
time, and the round's wall time) and one ``rounds.jsonl`` line (bs, wall ms, the top ops as
numbers). Traced rounds run slower by the profiler's own overhead: read the ops' self times,
not the wall. A failure to trace switches tracing off and is logged; the round itself runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from sglang_dflash.sglang_overlay import settings
from sglang_dflash.sglang_overlay.diagnostics.profile import positive_int_or

logger = logging.getLogger(__name__)

TRACE_ENV = settings.TRACE_ENV
MAX_ENV = settings.TRACE_MAX_ENV
DEFAULT_MAX = 8
TOP_OPS = 30


def parse_max(raw: str | None) -> int:
    """Batch sizes to trace (SGLANG_DFLASH_DDTREE_TRACE_MAX)."""
    return positive_int_or(raw, DEFAULT_MAX)


def top_ops(events: Any, limit: int = TOP_OPS) -> list[dict]:
    """The ops of a key_averages() list with the most self CPU time, as plain numbers (ms)."""
    rows = []
    for e in events:
        rows.append(
            {
                "name": e.key,
                "count": int(e.count),
                "self_cpu_ms": round(e.self_cpu_time_total / 1000.0, 3),
                "cpu_total_ms": round(e.cpu_time_total / 1000.0, 3),
                "self_device_ms": round(getattr(e, "self_device_time_total", 0.0) / 1000.0, 3),
            }
        )
    rows.sort(key=lambda r: r["self_cpu_ms"], reverse=True)
    return rows[:limit]


def torch_profiler() -> Any:
    """torch.profiler over CPU, and CUDA when available (imported only when tracing)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    return profile(activities=acts, record_shapes=False)


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class FirstRoundTracer:
    """Profiles the first round of each batch size (up to ``limit`` sizes) into ``directory``."""

    def __init__(
        self,
        directory: str | Path,
        *,
        limit: int = DEFAULT_MAX,
        profiler_factory: Callable[[], Any] = torch_profiler,
        synchronize: Callable[[], None] = _synchronize,
    ) -> None:
        self.directory = Path(directory)
        self.limit = limit
        self.seen: set[int] = set()
        self.error: str | None = None
        self._factory = profiler_factory
        self._sync = synchronize

    def wants(self, bs: int) -> bool:
        return self.error is None and bs not in self.seen and len(self.seen) < self.limit

    @contextlib.contextmanager
    def round(self, bs: int) -> Iterator[None]:
        """Wrap one decode round; traces it when it is the first of its batch size."""
        if not self.wants(bs):
            yield
            return
        self.seen.add(bs)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._sync()
            prof = self._factory()
            prof.__enter__()
        except Exception as exc:  # a measurement aid must never take the round down
            self._fail(exc)
            yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            try:
                self._sync()
                wall_ms = (time.perf_counter() - t0) * 1000.0
                prof.__exit__(None, None, None)
                self._write(bs, wall_ms, prof)
            except Exception as exc:
                self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        self.error = f"{type(exc).__name__}: {exc}"
        logger.warning("DDTree first-round tracing switched off: %s", self.error)

    def _write(self, bs: int, wall_ms: float, prof: Any) -> None:
        averages = prof.key_averages()
        table = averages.table(sort_by="self_cpu_time_total", row_limit=TOP_OPS)
        head = (
            f"DDTree first round at bs={bs}: wall {wall_ms:.2f} ms (profiler overhead included)\n"
        )
        (self.directory / f"round-bs{bs}.txt").write_text(head + table + "\n", encoding="utf-8")
        line = {"bs": bs, "wall_ms": round(wall_ms, 3), "top_ops": top_ops(averages)}
        with (self.directory / "rounds.jsonl").open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")


def from_env(environ: Mapping[str, str] | None = None, **kwargs: Any) -> FirstRoundTracer | None:
    """The tracer the env asks for, or None (the default: no cost but one ``is None`` test)."""
    env = os.environ if environ is None else environ
    directory = env.get(TRACE_ENV, "").strip()
    if not directory:
        return None
    return FirstRoundTracer(directory, limit=parse_max(env.get(MAX_ENV)), **kwargs)
