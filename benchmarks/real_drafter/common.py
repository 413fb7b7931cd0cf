"""Small helpers shared by the training phases: seeding and determinism, the LR schedule, a
phase timer, and what the report's ``reproducible`` rests on (the determinism settings in
force and the record of torch's non-determinism warnings)."""

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


# The two workspace configs under which cuBLAS gives the same result run to run (CUDA >= 10.2;
# torch's Context::checkCuBLASConfigDeterministic accepts exactly these).
CUBLAS_DETERMINISTIC_CONFIGS = (":4096:8", ":16:8")


def deterministic_cublas_workspace() -> str:
    """Make ``CUBLAS_WORKSPACE_CONFIG`` one of ``CUBLAS_DETERMINISTIC_CONFIGS`` and return it.

    A value already set to something else is replaced (``setdefault`` kept it). cuBLAS reads the
    variable when torch creates its first handle, so once CUDA has started a new value would be
    recorded but not in force: then this raises instead.
    """
    import torch

    value = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if value in CUBLAS_DETERMINISTIC_CONFIGS:
        return value
    if torch.cuda.is_initialized():
        raise RuntimeError(f"CUBLAS_WORKSPACE_CONFIG={value!r} and CUDA has started: set it to "
                           f"{CUBLAS_DETERMINISTIC_CONFIGS[0]} before the process uses CUDA")
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_DETERMINISTIC_CONFIGS[0]
    return CUBLAS_DETERMINISTIC_CONFIGS[0]


def seed_everything(seed: int) -> None:
    """Seed Python and torch (CPU and CUDA); torch's strict deterministic mode; cuBLAS's
    deterministic workspace (before any CUDA work: ``train`` calls this first).

    Strict (``use_deterministic_algorithms(True)``), not ``warn_only``, because warn_only hid a
    kernel torch does not call deterministic: torch then still *selects* cuDNN attention for
    SDPA, first on sm90 with cuDNN newer than 9.15.0 (``priority_order`` in
    ``transformers/cuda/sdp_utils.cpp``; the 2026-12-05 train.log shows torch 2.11 picking it
    on the H200), and its forward warns of nothing. torch drops cuDNN SDPA as non-deterministic
    in strict mode only (``check_cudnn_deterministic``), and its graph (``native/cudnn/MHA.cpp``)
    takes cuDNN's heuristic plan without asking for a deterministic one. The forward-only phases
    (greedy generation, target features, evaluation) ran it outside ``deterministic_attention``:
    two H100 runs of 2026-12 gave the same target but another drafter, with
    ``nondeterministic_ops`` empty; the other kernels of generation and drafter training are
    cuBLAS GEMMs, math SDPA, fused AdamW and norms as in the (bit-identical) target training, or
    gathers, argmax and elementwise ops without atomics. Strict mode also raises on every
    op without a deterministic implementation where warn_only only warns, and the flash /
    memory-efficient backward warnings are ``TORCH_WARN_ONCE`` (a second run in the same process
    would not have recorded them). The full H100 runs recorded no such warning in any phase,
    and torch raises in strict mode where it warns in warn_only, so none should raise there.
    """
    import torch

    deterministic_cublas_workspace()
    random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    # cuDNN's deterministic algorithms where it picks one (convolutions; the SDPA docstring
    # names it too, but the cuDNN attention graph does not read it: see above)
    torch.backends.cudnn.deterministic = True


@contextmanager
def restoring_determinism() -> Iterator[None]:
    """Restore torch's process-wide determinism flags on exit: ``seed_everything`` sets them for
    the whole process, and a caller running the training in-process (the CPU tests) should not
    inherit strict mode."""
    import torch

    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    benchmark, cudnn_det = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = benchmark, cudnn_det


# What deterministic_attention sets around the training phases (recorded in the report).
TRAIN_ATTENTION = {
    "train_sdpa_backends": ["MATH"],
    "train_sdpa_math_bf16_reduction": True,
}


def determinism_in_force() -> dict:
    """The determinism settings in force, read back from torch and the environment: the report
    records these rather than what the code meant to set."""
    import torch

    cuda = torch.backends.cuda
    if not torch.are_deterministic_algorithms_enabled():
        mode = "off"
    elif torch.is_deterministic_algorithms_warn_only_enabled():
        mode = "warn_only"
    else:
        mode = "strict"
    return {
        "use_deterministic_algorithms": mode,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        # outside training: which fused SDPA backends torch may pick (strict mode drops cuDNN)
        "sdpa_enabled": {"cudnn": cuda.cudnn_sdp_enabled(), "flash": cuda.flash_sdp_enabled(),
                         "mem_efficient": cuda.mem_efficient_sdp_enabled(),
                         "math": cuda.math_sdp_enabled()},
        "sdpa_cudnn_selectable": cuda.cudnn_sdp_enabled() and mode != "strict",
        **TRAIN_ATTENTION,
    }


def settings_not_deterministic(settings: Mapping) -> list[str]:
    """The keys of ``determinism_in_force()`` whose value leaves torch free to give another
    result run to run: not strict mode, a cuBLAS workspace outside the deterministic two, cuDNN
    benchmarking or non-deterministic cuDNN algorithms, cuDNN attention selectable."""
    bad = []
    if settings["use_deterministic_algorithms"] != "strict":
        bad.append("use_deterministic_algorithms")
    if settings["cublas_workspace_config"] not in CUBLAS_DETERMINISTIC_CONFIGS:
        bad.append("cublas_workspace_config")
    if settings["cudnn_benchmark"]:
        bad.append("cudnn_benchmark")
    if not settings["cudnn_deterministic"]:
        bad.append("cudnn_deterministic")
    if settings["sdpa_cudnn_selectable"]:
        bad.append("sdpa_cudnn_selectable")
    return bad


@contextmanager
def deterministic_attention() -> Iterator[None]:
    """Scaled dot-product attention on the math backend only (both training phases).

    Why: the math backend is plain matmul + softmax and their backwards: deterministic, it
    alerts for nothing, and the target it trains came out bit-identical in two H100 sessions
    (2026-12, sha256 ``cc2eb2b11a2b…``). The fused backwards are not a safe substitute: in
    ``attention_backward.cu`` flash and memory-efficient attention keep an atomic / split-key
    backward unless strict mode is on (``seed_everything`` now turns it on, but the math path
    is the one measured), and cuDNN attention's graph (``native/cudnn/MHA.cpp``) asks cuDNN
    for no deterministic algorithm at all (the 2026-12-05 train.log warned of it). torch's
    docs do not list SDPA among the ops of ``use_deterministic_algorithms``
    (https://docs.pytorch.org/docs/stable/generated/torch.use_deterministic_algorithms.html);
    the behaviour above is read in the source:
    https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/native/transformers/cuda/attention_backward.cu

    Cost: the math backend materialises the score matrix. bf16/fp16 reduction is allowed
    (``allow_fp16_bf16_reduction_math_sdp``; torch's default upcasts to fp32) so that under
    bf16 autocast the scores stay bf16, as in transformers' eager attention, rather than fp32
    matmuls off the tensor cores. Forward-only phases (generation, features, evaluation) keep
    the fused backends, which strict mode limits to flash and memory-efficient attention
    (forwards without atomics); cuDNN attention, which warn_only left selectable, is out
    (``seed_everything``). Both settings are restored on exit.
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


def reproducibility(stopped_early: Mapping[str, bool], nondeterministic: Sequence[str],
                    settings: Mapping) -> dict:
    """The report's reproducibility fields. The pair follows from the seed alone only if no
    phase that makes it was cut by its wall-clock cap (else its step count depends on the
    machine's speed), torch reported no non-deterministic op and the settings in force
    (``determinism_in_force``) leave torch no non-deterministic choice (else the same steps
    can round differently run to run)."""
    cut = [name for name, stopped in stopped_early.items() if stopped]
    loose = settings_not_deterministic(settings)
    return {
        "reproducible": not cut and not nondeterministic and not loose,
        "stopped_early_phases": cut,
        "nondeterministic_ops": list(nondeterministic),
        "settings_not_deterministic": loose,
    }


# The report's ``reproducible_definition``: what "reproducible": true rests on, and what it
# cannot show.
REPRODUCIBLE_DEFINITION = (
    "true iff no phase that makes the pair was stopped by its wall-clock cap "
    "(stopped_early_phases empty), no warning during the run mentioned 'deterministic' "
    "(nondeterministic_ops empty, first line of each) and the settings in force (determinism) "
    "leave torch no non-deterministic choice (settings_not_deterministic empty): strict "
    "use_deterministic_algorithms (an op without a deterministic implementation raises; cuDNN "
    "attention is never selected), CUBLAS_WORKSPACE_CONFIG :4096:8 or :16:8, "
    "cudnn.deterministic, no cudnn.benchmark. Not shown by this run: that kernels torch does "
    "not flag (cuBLAS GEMMs, flash / memory-efficient attention forwards, fused AdamW) give "
    "the same bits run to run, which rests on NVIDIA's and torch's documentation; only a "
    "second run compared by sha256 shows it. Bitwise equality is expected only on the same "
    "GPU model and SM count with the same driver, CUDA, cuBLAS, cuDNN, torch and "
    "transformers versions"
)


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
