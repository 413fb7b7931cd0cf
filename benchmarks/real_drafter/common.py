"""Small helpers shared by the training phases: seeding, the LR schedule, a phase timer."""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field


def seed_everything(seed: int) -> None:
    """Seed Python, torch (CPU and CUDA); deterministic algorithms where torch has them.

    ``warn_only``: a few CUDA kernels (SDPA backward) have no deterministic variant; the run
    is seeded either way and the report records the checkpoint hashes.
    """
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac))))


@dataclass
class Phase:
    """Wall time of one phase and whether its cap stopped it early."""

    name: str
    cap_s: float
    start: float = field(default_factory=time.perf_counter)
    stopped_early: bool = False

    def over(self) -> bool:
        if time.perf_counter() - self.start > self.cap_s:
            self.stopped_early = True
        return self.stopped_early

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def sync(device) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
