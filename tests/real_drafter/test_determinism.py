"""The real-drafter report's determinism record, on the CPU with synthetic warnings.

``common.nondeterministic_ops`` picks torch's non-determinism warnings, ``common.reproducibility``
is the report's rule (no phase cut by its cap AND no such warning AND settings that leave torch
no non-deterministic choice), ``recording_warnings`` records every warning shown while still
showing it, ``deterministic_attention`` selects the math SDPA backend and restores the settings,
``seed_everything`` turns on strict mode and a deterministic cuBLAS workspace, and
``determinism_in_force`` reads back what is in force. The toy training run's wiring of these is
in ``test_real_drafter.py``.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # benchmarks/ has no __init__.py

from real_drafter.common import (  # noqa: E402
    CUBLAS_DETERMINISTIC_CONFIGS,
    TRAIN_ATTENTION,
    determinism_in_force,
    deterministic_attention,
    deterministic_cublas_workspace,
    nondeterministic_ops,
    recording_warnings,
    reproducibility,
    restoring_determinism,
    seed_everything,
    settings_not_deterministic,
)

# torch's own texts (torch 2.11 / 2.13)
CUDNN = ("cuDNN Attention defaults to a non-deterministic algorithm. To explicitly enable "
         "determinism call torch.use_deterministic_algorithms(True, warn_only=False). "
         "(Triggered internally at /pytorch/aten/src/ATen/native/transformers/cuda/"
         "attention_backward.cu:212.)")
FLASH = ("Flash Attention defaults to a non-deterministic algorithm. To explicitly enable "
         "determinism call torch.use_deterministic_algorithms(True, warn_only=False).")
ALERT = ("index_add_cuda_ does not have a deterministic implementation, but you set "
         "'torch.use_deterministic_algorithms(True, warn_only=True)'. You can file an issue at "
         "https://github.com/pytorch/pytorch/issues to help us prioritize adding deterministic "
         "support for this operation.")
CUBLAS = ("Deterministic behavior was enabled with either `torch.use_deterministic_algorithms"
          "(True)` or `at::Context::setDeterministicAlgorithms(true)`, but this operation is "
          "not deterministic because it uses CuBLAS and you have CUDA >= 10.2.")
BENIGN = "TypedStorage is deprecated. It will be removed in the future."


def test_nondeterministic_ops_first_lines_once_in_order():
    msgs = [BENIGN, CUDNN, ALERT + "\n  second line of the same warning", "", "   \n",
            CUDNN, "  " + FLASH + "  ", CUBLAS, "SyntaxWarning: invalid escape sequence '\\.'",
            ALERT]
    assert nondeterministic_ops(msgs) == [CUDNN, ALERT, FLASH, CUBLAS]
    assert nondeterministic_ops([]) == []
    assert nondeterministic_ops([BENIGN, "determinate"]) == []


# settings as determinism_in_force reads them after seed_everything
STRICT = {"use_deterministic_algorithms": "strict", "cublas_workspace_config": ":4096:8",
          "cudnn_deterministic": True, "cudnn_benchmark": False,
          "float32_matmul_precision": "highest",
          "sdpa_enabled": {"cudnn": True, "flash": True, "mem_efficient": True, "math": True},
          "sdpa_cudnn_selectable": False, **TRAIN_ATTENTION}
# what the 2026-12 H100 runs had in force: warn_only, which leaves cuDNN attention selectable
WARN_ONLY = {**STRICT, "use_deterministic_algorithms": "warn_only",
             "sdpa_cudnn_selectable": True}


@pytest.mark.parametrize(("stopped", "ops", "settings", "expected"), [
    ({"target_train": False, "generate": False, "draft_train": False}, [], STRICT,
     {"reproducible": True, "stopped_early_phases": [], "nondeterministic_ops": [],
      "settings_not_deterministic": []}),
    ({"target_train": True, "generate": False, "draft_train": False}, [], STRICT,
     {"reproducible": False, "stopped_early_phases": ["target_train"],
      "nondeterministic_ops": [], "settings_not_deterministic": []}),
    ({"target_train": False, "generate": False, "draft_train": False}, [CUDNN], STRICT,
     {"reproducible": False, "stopped_early_phases": [], "nondeterministic_ops": [CUDNN],
      "settings_not_deterministic": []}),
    ({"target_train": False, "generate": True, "draft_train": True}, [CUDNN, FLASH], STRICT,
     {"reproducible": False, "stopped_early_phases": ["generate", "draft_train"],
      "nondeterministic_ops": [CUDNN, FLASH], "settings_not_deterministic": []}),
    # the H100 runs' case: nothing cut, nothing warned, and yet the drafter did not recur
    ({"target_train": False, "generate": False, "draft_train": False}, [], WARN_ONLY,
     {"reproducible": False, "stopped_early_phases": [], "nondeterministic_ops": [],
      "settings_not_deterministic": ["use_deterministic_algorithms",
                                     "sdpa_cudnn_selectable"]}),
])
def test_reproducible_only_without_cut_nondeterminism_or_loose_settings(stopped, ops, settings,
                                                                         expected):
    assert reproducibility(stopped, ops, settings) == expected


@pytest.mark.parametrize(("change", "loose"), [
    ({"cublas_workspace_config": None}, ["cublas_workspace_config"]),
    ({"cublas_workspace_config": ":4096:2"}, ["cublas_workspace_config"]),
    ({"cublas_workspace_config": ":16:8"}, []),
    ({"cudnn_benchmark": True}, ["cudnn_benchmark"]),
    ({"cudnn_deterministic": False}, ["cudnn_deterministic"]),
    ({"use_deterministic_algorithms": "off", "sdpa_cudnn_selectable": True},
     ["use_deterministic_algorithms", "sdpa_cudnn_selectable"]),
])
def test_settings_not_deterministic_names_each_loose_setting(change, loose):
    assert settings_not_deterministic({**STRICT, **change}) == loose


@pytest.mark.parametrize(("before", "after"), [
    (None, ":4096:8"), (":4096:2", ":4096:8"), ("", ":4096:8"), (":16:8", ":16:8"),
    (":4096:8", ":4096:8"),
])
def test_cublas_workspace_becomes_deterministic(monkeypatch, before, after):
    """A missing or non-deterministic value is replaced (setdefault kept ":4096:2"); a
    deterministic one stays."""
    pytest.importorskip("torch", reason="torch is not installed: the helper asks it whether "
                        "CUDA has started")
    if before is None:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    else:
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", before)
    assert deterministic_cublas_workspace() == after
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == after in CUBLAS_DETERMINISTIC_CONFIGS


def test_cublas_workspace_too_late_once_cuda_started(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:2")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="before the process uses CUDA"):
        deterministic_cublas_workspace()


def test_seed_everything_is_strict_and_restored(monkeypatch):
    """After seed_everything an op without a deterministic implementation raises (warn_only
    only warned), the record reads strict mode back, and restoring_determinism puts torch's
    process-wide flags back."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    with restoring_determinism():
        seed_everything(0)
        t = torch.zeros(4)
        with pytest.raises(RuntimeError, match="put_ does not have a deterministic"):
            t.put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]), accumulate=False)
        got = determinism_in_force()
        assert got["use_deterministic_algorithms"] == "strict"
        assert got["cublas_workspace_config"] == ":4096:8"
        assert got["sdpa_cudnn_selectable"] is False
        assert settings_not_deterministic(got) == []
        torch.use_deterministic_algorithms(True, warn_only=True)
        assert settings_not_deterministic(determinism_in_force()) == [
            "use_deterministic_algorithms", "sdpa_cudnn_selectable"]
    assert (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic) == before


def test_recording_warnings_records_and_still_shows():
    before = warnings.showwarning
    with warnings.catch_warnings(record=True) as outer:
        warnings.simplefilter("always")
        with recording_warnings() as shown:
            warnings.warn(CUDNN, UserWarning, stacklevel=1)
            warnings.warn(BENIGN, DeprecationWarning, stacklevel=1)
    assert shown == [CUDNN, BENIGN]
    assert [str(w.message) for w in outer] == [CUDNN, BENIGN]  # passed on, in order
    assert [w.category for w in outer] == [UserWarning, DeprecationWarning]
    assert warnings.showwarning is before


def test_recording_warnings_outer_ignore_cannot_hide_nondeterminism():
    with warnings.catch_warnings(record=True) as outer:
        warnings.simplefilter("ignore")
        with recording_warnings() as shown:
            for _ in range(3):  # one place, every step: recorded once ("default")
                warnings.warn(FLASH, UserWarning, stacklevel=1)
            warnings.warn(BENIGN, UserWarning, stacklevel=1)  # the outer "ignore" holds
    assert shown == [FLASH]
    assert [str(w.message) for w in outer] == [FLASH]
    assert nondeterministic_ops(shown) == [FLASH]


def test_recording_warnings_records_a_real_torch_alert():
    torch = pytest.importorskip("torch")
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        with warnings.catch_warnings(record=True), recording_warnings() as shown:
            t = torch.zeros(4)
            # put_ without accumulate has no deterministic implementation, on the CPU too
            t.put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]), accumulate=False)
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    ops = nondeterministic_ops(shown)
    assert len(ops) == 1
    assert ops[0].startswith("put_ does not have a deterministic implementation")


def _sdpa_flags(torch):
    b = torch.backends.cuda
    return {"math": b.math_sdp_enabled(), "flash": b.flash_sdp_enabled(),
            "mem_efficient": b.mem_efficient_sdp_enabled(), "cudnn": b.cudnn_sdp_enabled(),
            "bf16_reduction": b.fp16_bf16_reduction_math_sdp_allowed()}


def test_deterministic_attention_selects_math_and_restores():
    torch = pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend

    before = _sdpa_flags(torch)
    q = torch.randn(2, 4, 8, 16)
    with deterministic_attention():
        assert _sdpa_flags(torch) == {"math": True, "flash": False, "mem_efficient": False,
                                      "cudnn": False, "bf16_reduction": True}
        assert torch._fused_sdp_choice(q, q, q) == SDPBackend.MATH.value
    assert _sdpa_flags(torch) == before
    with pytest.raises(RuntimeError, match="boom"), deterministic_attention():
        raise RuntimeError("boom")
    assert _sdpa_flags(torch) == before
    assert TRAIN_ATTENTION["train_sdpa_backends"] == ["MATH"]
    assert TRAIN_ATTENTION["train_sdpa_math_bf16_reduction"] is True
