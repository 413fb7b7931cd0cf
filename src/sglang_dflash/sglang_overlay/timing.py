"""Host-clock timing events (the CPU stand-in for CUDA timing events, shared by the adaptive
meter and the profiler) and the round's profiler ranges. No torch at import: the diagnostics
and their tests import this module without torch."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable


class HostEvent:
    """A CPU stand-in for ``torch.cuda.Event(enable_timing=True)`` (CPU devices, tests)."""

    def __init__(self) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end: HostEvent) -> float:
        return (end.t - self.t) * 1000.0


RANGE_PREFIX = "ddtree."
_NULL = contextlib.nullcontext()


def _no_range(_name: str) -> contextlib.AbstractContextManager:
    return _NULL


def stage_ranges(profiler_enabled: Callable[[], bool] | None = None):
    """``name -> context manager`` for one round: a ``torch.profiler.record_function`` range
    named ``ddtree.<name>`` while a profiler records (SGLang's ``/start_profile``), so a trace
    shows the host time of each stage of the round; otherwise a shared no-op (about 0.3 us a
    round to ask, nothing per stage). torch is imported here, not at module level."""
    import torch

    enabled = profiler_enabled or torch._C._autograd._profiler_enabled
    if not enabled():
        return _no_range
    record = torch.profiler.record_function
    return lambda name: record(RANGE_PREFIX + name)
