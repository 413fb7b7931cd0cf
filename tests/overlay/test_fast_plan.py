"""The sync-free width-1 verify plan (sglang_overlay/fast_plan.py): which captured FlashInfer
wrappers take SGLang's ``fast_prefill_plan`` and which keep FlashInfer's own plan. Stand-in
objects carry the attributes SGLang 0.5.17's FlashInfer backend and FlashInfer's wrapper have;
tests/overlay/test_sglang_hooks.py pins those names against the real SGLang code."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace
from typing import ClassVar

import pytest

from sglang_dflash.sglang_overlay import fast_plan, settings


def plan(wrapper, *args, **kwargs):  # stands in for SGLang's fast_prefill_plan
    return ("fast", wrapper)


def _upstream_plan(*args, **kwargs):
    return "upstream"


def wrapper(**over):
    fields = {"is_cuda_graph_enabled": True, "_backend": "fa2", "_cached_module": object(),
              "_custom_mask_buf": None}
    w = SimpleNamespace(**(fields | over))
    w.begin_forward = _upstream_plan
    return w


def backend(wrappers: dict, **over):
    fields = {"prefill_cuda_graph_metadata": wrappers, "prefill_backend": "fa2",
              "dispatch_reason": None}
    return SimpleNamespace(**(fields | over))


def test_every_unmasked_captured_wrapper_takes_the_fast_plan():
    ws = {1: [wrapper()], 8: [wrapper()], 32: [wrapper(), wrapper()]}
    b = backend(ws)
    assert fast_plan.install(b, plan) == (4, None)
    for w in (w for group in ws.values() for w in group):
        assert isinstance(w.begin_forward, partial) and w.begin_forward.func is plan
        assert w.begin_forward() == ("fast", w)  # bound to its own wrapper
    assert fast_plan.install(b, plan) == (0, "bs 1: already installed")  # idempotent


@pytest.mark.parametrize("over, needle", [
    ({"_custom_mask_buf": object()}, "custom-mask buffer (a masked verify) and no mask packer"),
    ({"is_cuda_graph_enabled": False}, "not a CUDA-graph wrapper"),
    ({"_backend": "fa3"}, "'fa3', not fa2"),
    ({"_cached_module": None}, "not planned at capture"),
])
def test_a_wrapper_that_cannot_keeps_flashinfers_plan(over, needle):
    bad, good = wrapper(**over), wrapper()
    n, reason = fast_plan.install(backend({1: [bad], 8: [good]}), plan)
    assert n == 1 and reason.startswith("bs 1: ") and needle in reason
    assert bad.begin_forward is _upstream_plan
    assert good.begin_forward.func is plan


@pytest.mark.parametrize("over, needle", [
    ({"prefill_backend": "fa3"}, "not fa2"),
    ({"dispatch_reason": "SLIDING_WINDOW"}, "SWA/cross"),
    ({"prefill_cuda_graph_metadata": None}, "not SGLang's FlashInfer backend"),
])
def test_a_backend_that_cannot_is_left_alone(over, needle):
    w = wrapper()
    n, reason = fast_plan.install(backend({1: [w]}, **over), plan)
    assert n == 0 and needle in reason
    assert w.begin_forward is _upstream_plan


def test_a_non_flashinfer_backend_is_named():
    n, reason = fast_plan.install(SimpleNamespace(), plan)
    assert n == 0 and reason == "SimpleNamespace is not SGLang's FlashInfer backend"


def test_switch_is_on_by_default_and_strict():
    env = settings.FAST_PLAN_ENV
    assert settings.fast_plan_from_env({}) == "on"  # the default since §22
    assert settings.fast_plan_from_env({env: "0"}) == "off"
    assert settings.fast_plan_from_env({env: " 1 "}) == "on"
    assert settings.fast_plan_from_env({env: "check"}) == "check"
    for bad in ("yes", "2", "true", "CHECK"):
        with pytest.raises(settings.DDTreeConfigError,
                           match="expected 1 \\(on, the default\\), check"):
            settings.fast_plan_from_env({env: bad})


def test_bound_check_names_the_rows_below_the_device():
    torch = pytest.importorskip("torch", reason="the bound check reads torch tensors")

    dev = torch.tensor([10, 20, 30])
    assert fast_plan.bound_violation(dev, torch.tensor([10, 25, 30]), None, 16) is None
    why = fast_plan.bound_violation(dev, torch.tensor([9, 25, 29]), None, 16)
    assert why == ("fast plan host bound below the device prefix (seq_lens_cpu; 2 row(s)): "
                   "row 0: device 10 > host 9, row 2: device 30 > host 29")
    # no host lengths: the reserved lengths less a block are the bound
    assert fast_plan.bound_violation(dev, None, torch.tensor([26, 36, 46]), 16) is None
    assert "row 1: device 20 > host 19" in fast_plan.bound_violation(
        dev, None, torch.tensor([26, 35, 46]), 16)
    assert fast_plan.bound_violation(dev, None, None, 16) is None  # read back: nothing to check
    short = fast_plan.bound_violation(dev, torch.tensor([10, 20]), None, 16)
    assert "row 2: device 30 > host None" in short


HOST = {"qo_indptr_host": "qo_h", "kv_indptr_host": "kv_h", "kv_lens_host": "lens_h",
        "max_q_len": 16, "max_kv_len": 300}


def test_a_masked_wrapper_packs_its_mask_then_takes_the_fast_plan():
    """SGLang dispatches on ``begin_forward.func``; the mask goes to the wrapper's own buffers,
    sized by the host bounds; the plan then runs without it (it is in the buffer)."""
    calls = []

    def pack(mask, qo, kv, last, page, out, out_indptr, max_bits):
        calls.append(("pack", mask, qo, kv, last, page, out, out_indptr, max_bits))

    def fast(wrapper, *args, **kwargs):
        calls.append(("fast", wrapper, args, kwargs))

    buf, indptr_buf = object(), object()
    masked = wrapper(_custom_mask_buf=buf, _mask_indptr_buf=indptr_buf)
    plain = wrapper()
    assert fast_plan.install(backend({4: [masked, plain]}), fast, pack) == (2, None)
    assert masked.begin_forward.func is fast and plain.begin_forward.func is fast
    assert isinstance(masked.begin_forward, fast_plan.MaskedFastPlan)
    masked.begin_forward("qo", "kv", "idx", "last", 32, 8, 128, 1, q_data_type="bf16",
                         custom_mask="M", non_blocking=True, **HOST)
    assert calls[0] == ("pack", "M", "qo", "kv", "last", 1, buf, indptr_buf, 16 * 300)
    assert calls[1] == ("fast", masked, ("qo", "kv", "idx", "last", 32, 8, 128, 1),
                        {"q_data_type": "bf16", "custom_mask": None, "non_blocking": True,
                         **HOST})


def test_a_masked_wrapper_called_without_a_mask_keeps_flashinfers_plan():
    seen = []

    def upstream(*args, **kwargs):
        seen.append((args, kwargs))

    masked = wrapper(_custom_mask_buf=object(), _mask_indptr_buf=object())
    masked.begin_forward = upstream
    fast_plan.install(backend({1: [masked]}), plan, lambda *a: pytest.fail("packed"))
    masked.begin_forward("qo", "kv", "idx", "last", 32, 8, 128, 1, custom_mask=None,
                         window_left=-1, **HOST)
    assert seen == [(("qo", "kv", "idx", "last", 32, 8, 128, 1),
                     {"custom_mask": None, "window_left": -1})]  # no host layout for plan()



class _Event:
    """Records what the fence does, in order, into a shared log."""

    log: ClassVar[list] = []
    made = 0

    def __init__(self):
        _Event.made += 1
        self.n = _Event.made

    def record(self):
        _Event.log.append(("record", self.n))

    def synchronize(self):
        _Event.log.append(("wait", self.n))


def test_the_fence_waits_for_the_previous_plan_on_its_wrapper_before_planning():
    """The host plan buffer is rewritten only after the GPU has reached the previous plan's
    copy: plan 2 waits on plan 1's event, plan 3 on plan 2's; each wrapper keeps its own."""
    _Event.log, _Event.made = [], 0

    def fast(wrapper, *args, **kwargs):
        _Event.log.append(("plan", wrapper.name))

    a, b = wrapper(), wrapper()
    a.name, b.name = "a", "b"
    assert fast_plan.install(backend({1: [a], 8: [b]}), fast, fence=_Event) == (2, None)
    assert isinstance(a.begin_forward, fast_plan.FencedPlan) and a.begin_forward.func is fast
    a.begin_forward()
    b.begin_forward()
    a.begin_forward()
    a.begin_forward()
    assert _Event.log == [("plan", "a"), ("record", 1), ("plan", "b"), ("record", 2),
                          ("wait", 1), ("plan", "a"), ("record", 3),
                          ("wait", 3), ("plan", "a"), ("record", 4)]
    # still recognised as installed: a second install leaves it alone
    again = fast_plan.install(backend({1: [a]}), fast, fence=_Event)
    assert again == (0, "bs 1: already installed")
