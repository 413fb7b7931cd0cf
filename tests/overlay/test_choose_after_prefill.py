"""The worker passes "this round follows a prefill" to the policy (SGLang CPU env).

The policy's deferral is tested in tests/overlay/test_policy.py; this checks the wiring in
the real worker class (tests/overlay/sglang_choose_probe.py): an extend forward sets the flag,
the next round's choice gets it and keeps the current budget, the flag is cleared, and the
round after probes the top budget (H100 §40-§41: that probe right after a prefill walled
15-78 ms at bs 1). The GPU grid's ``wall_after_prefill_ms`` and first-token medians are the
real-server side (docs/gpu-results.md).
"""

from __future__ import annotations

import os

import pytest
from test_sglang_hooks import _python, _run_script


@pytest.fixture(scope="module")
def probe() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DFLASH_DDTREE")}
    return _run_script(_python(), "sglang_choose_probe.py", [], env)


def test_the_round_after_an_extend_is_chosen_as_after_prefill_and_waits_to_probe(probe):
    assert probe["extend_result"] == "extend-forward" and probe["flag_after_extend"] is True
    assert probe["after_prefill"] == [True, False, False]
    assert probe["fresh"] == [1.0, 1.0, 0.0]  # the probe measured the new request
    assert probe["budgets"] == [15, 64, 15]
    assert probe["flag_now"] is False and probe["runner_backend"] == "backend-15"
