"""SGLANG_DFLASH_DDTREE_HOST_LENS: the switch, and what SGLang's scheduler decides from it.

With ``bound`` the DDTree worker tells SGLang that no attention backend of its round needs the
exact lengths on the host, so the scheduler stops copying them (and waiting for the copy) before
each round; the round's plans then read the reserved bound (``_verify_inputs``, ``_draft_topk``,
and ``fast_plan.bound_violation`` under ``FAST_PLAN=check``). The decision is SGLang's own
function on the real worker class (SGLang CPU env). That it pays and stays token-identical was
measured on a GPU (docs/gpu-results.md §26); since then ``bound`` is the default.
"""

from __future__ import annotations

import os

import pytest
from test_sglang_hooks import _python, _run_script

from sglang_dflash.sglang_overlay import settings


def test_switch_defaults_to_bound_and_is_strict():
    env = settings.HOST_LENS_ENV
    assert settings.host_lens_from_env({}) == "bound"
    assert settings.host_lens_from_env({env: " bound "}) == "bound"
    assert settings.host_lens_from_env({env: "sync"}) == "sync"
    for bad in ("1", "on", "BOUND", "reserved"):
        with pytest.raises(settings.DDTreeConfigError) as exc:
            settings.host_lens_from_env({env: bad})
        assert "\n" not in str(exc.value) and "bound (the default" in str(exc.value)
        assert "or sync" in str(exc.value)


def test_the_bound_needs_the_sync_free_plan():
    """FAST_PLAN=0 hands planning back to FlashInfer, which reads SGLang's host lengths."""
    for fast_plan in ("on", "check"):
        assert settings.resolve_host_lens("bound", fast_plan) == "bound"
        assert settings.resolve_host_lens("sync", fast_plan) == "sync"
    assert settings.resolve_host_lens("bound", "off") == "sync"


def test_the_start_up_line_says_which_and_why():
    host_lens_line = settings.host_lens_line
    assert host_lens_line("bound", "on").startswith("DDTree host lengths: bound (")
    assert "FAST_PLAN=0" in host_lens_line("sync", "off")
    assert f"{settings.HOST_LENS_ENV}=sync" in host_lens_line("sync", "on")


@pytest.fixture(scope="module")
def probe() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DFLASH_DDTREE")}
    return _run_script(_python(), "sglang_host_lens_probe.py", [], env)


def test_sglang_copies_the_lengths_unless_the_round_plans_from_the_bound(probe):
    assert probe["flashinfer_needs"] is True  # what makes SGLang copy them at all
    assert probe["sync"] is True
    assert probe["bound"] is False and probe["unset"] is False  # the default is the bound
    assert probe["sync_wraps"] == probe["bound_wraps"] == [True, True]


def test_two_batch_overlap_still_gets_the_lengths(probe):
    assert probe["bound_tbo"] is True  # SGLang forces them there; the switch does not override
