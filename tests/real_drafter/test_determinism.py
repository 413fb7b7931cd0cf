"""The real-drafter report's determinism record, on the CPU with synthetic warnings.

``common.nondeterministic_ops`` picks torch's non-determinism warnings, ``common.reproducibility``
is the report's rule (no phase cut by its cap AND no such warning), ``recording_warnings``
records every warning shown while still showing it, and ``deterministic_attention`` selects the
math SDPA backend and restores the settings. The toy training run's wiring of these is in
``test_real_drafter.py``.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # benchmarks/ has no __init__.py

from real_drafter.common import (  # noqa: E402
    DETERMINISM_SETTINGS,
    deterministic_attention,
    nondeterministic_ops,
    recording_warnings,
    reproducibility,
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


@pytest.mark.parametrize(("stopped", "ops", "expected"), [
    ({"target_train": False, "generate": False, "draft_train": False}, [],
     {"reproducible": True, "stopped_early_phases": [], "nondeterministic_ops": []}),
    ({"target_train": True, "generate": False, "draft_train": False}, [],
     {"reproducible": False, "stopped_early_phases": ["target_train"],
      "nondeterministic_ops": []}),
    ({"target_train": False, "generate": False, "draft_train": False}, [CUDNN],
     {"reproducible": False, "stopped_early_phases": [], "nondeterministic_ops": [CUDNN]}),
    ({"target_train": False, "generate": True, "draft_train": True}, [CUDNN, FLASH],
     {"reproducible": False, "stopped_early_phases": ["generate", "draft_train"],
      "nondeterministic_ops": [CUDNN, FLASH]}),
])
def test_reproducible_only_without_cut_and_without_nondeterminism(stopped, ops, expected):
    assert reproducibility(stopped, ops) == expected


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
    assert DETERMINISM_SETTINGS["train_sdpa_backends"] == ["MATH"]
    assert DETERMINISM_SETTINGS["train_sdpa_math_bf16_reduction"] is True
