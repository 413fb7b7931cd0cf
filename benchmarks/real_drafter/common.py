"""Small helpers shared by the training phases: seeding and determinism, the LR schedule, a
phase timer, and the record of torch's non-determinism warnings that the report's
``reproducible`` rests on."""

from __future__ import annotations

import math
import os
import random
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

# A warning whose message contains this word (any case) reports a non-deterministic op: torch's
# alerts read "<op> does not have a deterministic implementation, but you set
# 'torch.use_deterministic_algorithms(True, warn_only=True)'", its SDPA backwards "<backend>
# defaults to a non-deterministic algorithm", its cuBLAS check "... is not deterministic
# because it uses CuBLAS".
NONDETERMINISM_WORD = "deterministic"


def seed_everything(seed: int) -> None:
    """Seed Python, torch (CPU and CUDA); deterministic algorithms where torch has them.

    ``warn_only=True`` stays: in strict mode an op without a deterministic implementation
    raises, which no CPU test can rule out for the CUDA run, whereas a warning is recorded
    (``recording_warnings``) and makes the report say ``"reproducible": false``. The one such
    op seen on the H200 (2026-12-05 train.log: "cuDNN Attention defaults to a non-deterministic
    algorithm") is avoided by ``deterministic_attention`` around the training phases.
    """
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    # cuDNN's deterministic algorithms where it picks one (convolutions; the SDPA docstring
    # names it too, but the cuDNN attention backward does not read it: deterministic_attention)
    torch.backends.cudnn.deterministic = True


# What seed_everything and deterministic_attention set (recorded in the report).
DETERMINISM_SETTINGS = {
    "use_deterministic_algorithms": "warn_only",
    "cudnn_deterministic": True,
    "cudnn_benchmark": False,
    "train_sdpa_backends": ["MATH"],
    "train_sdpa_math_bf16_reduction": True,
}


@contextmanager
def deterministic_attention() -> Iterator[None]:
    """Scaled dot-product attention on the math backend only (both training phases).

    Why: on CUDA none of torch's three fused SDPA backwards is deterministic under
    ``use_deterministic_algorithms(True, warn_only=True)``. In ``attention_backward.cu`` (torch
    2.11: line 212 is the warning in the 2026-12-05 train.log) flash and memory-efficient
    attention warn "... defaults to a non-deterministic algorithm" and keep their atomic /
    split-key backward; only ``warn_only=False`` switches them to a deterministic one (flash
    ``deterministic=true``, memory-efficient ``num_splits_key = 1``), and strict mode is not
    used here (``seed_everything``). cuDNN attention warns the same way, and its backward graph
    (``native/cudnn/MHA.cpp``) does not ask cuDNN for a deterministic algorithm, so neither
    strict mode nor ``cudnn.deterministic`` (which the SDPA docstring suggests) is read on that
    path. The math backend is plain matmul + softmax and their backwards: deterministic, and it
    alerts for nothing. torch's docs do not list SDPA among the ops of
    ``use_deterministic_algorithms``
    (https://docs.pytorch.org/docs/stable/generated/torch.use_deterministic_algorithms.html);
    the behaviour above is read in the source:
    https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/native/transformers/cuda/attention_backward.cu

    Cost: the math backend materialises the score matrix. bf16/fp16 reduction is allowed
    (``allow_fp16_bf16_reduction_math_sdp``; torch's default upcasts to fp32) so that under
    bf16 autocast the scores stay bf16, as in transformers' eager attention, rather than fp32
    matmuls off the tensor cores. Forward-only phases (generation, features, evaluation) keep
    the fused backends: their forwards are deterministic. Both settings are restored on exit.
    """
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    allowed = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(allowed)


@contextmanager
def recording_warnings() -> Iterator[list[str]]:
    """Yield a list that collects the message of every warning shown inside; each is still
    shown (passed on to the ``showwarning`` in force outside).

    A message that mentions ``NONDETERMINISM_WORD`` is shown once per place whatever the
    filters outside say (an outer "ignore" cannot hide it from the report); other warnings
    follow the outer filters. Messages are recorded as shown, so one repeated every step
    (action "default") is recorded once per place.
    """
    sink: list[str] = []
    with warnings.catch_warnings():
        warnings.filterwarnings("default", message=rf"(?s).*{NONDETERMINISM_WORD}")
        shown = warnings.showwarning

        def tee(message, category, filename, lineno, file=None, line=None):
            sink.append(str(message))
            shown(message, category, filename, lineno, file, line)

        warnings.showwarning = tee
        yield sink


def nondeterministic_ops(messages: Iterable[str]) -> list[str]:
    """The warnings among ``messages`` that report a non-deterministic op: the first line of
    each message that mentions ``NONDETERMINISM_WORD`` (any case), stripped, each once, in
    order of first appearance."""
    out: list[str] = []
    for m in messages:
        text = str(m).strip()
        if NONDETERMINISM_WORD not in text.lower():
            continue
        first = text.splitlines()[0].strip()
        if first not in out:
            out.append(first)
    return out


def reproducibility(stopped_early: Mapping[str, bool], nondeterministic: Sequence[str]) -> dict:
    """The report's reproducibility fields. The pair follows from the seed alone only if no
    phase that makes it was cut by its wall-clock cap (else its step count depends on the
    machine's speed) and torch reported no non-deterministic op (else the same steps can
    round differently run to run)."""
    cut = [name for name, stopped in stopped_early.items() if stopped]
    return {
        "reproducible": not cut and not nondeterministic,
        "stopped_early_phases": cut,
        "nondeterministic_ops": list(nondeterministic),
    }


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
