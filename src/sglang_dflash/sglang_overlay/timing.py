"""Host-clock timing events: the CPU stand-in for CUDA timing events, shared by the adaptive
meter (production) and the profiler (diagnostics). Pure Python, no torch: the diagnostics and
their tests import it without torch."""

from __future__ import annotations

import time


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
