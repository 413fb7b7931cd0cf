"""Sync-free FlashInfer planning for the width-1 (no-draft) verify graphs.

FlashInfer's ``BatchPrefillWithPagedKVCacheWrapper.plan`` copies ``qo_indptr``,
``paged_kv_indptr`` and ``paged_kv_last_page_len`` to the host on every call: three blocking
device-to-host copies that wait for everything queued before them. SGLang 0.5.17 swaps in its
sync-free ``fast_prefill_plan`` (the layout comes from the host) for the draft-extend graphs
only, so each TARGET_VERIFY replay still drains the GPU queue. A round that verifies once pays
it while the GPU is idle anyway; the k-step no-draft round verifies k times in a row, and on the
H200 each of its steps waited ~2.2 ms for the previous step's forward (docs/gpu-results.md §21:
3 synchronising copies a verify, 16 ms of copies in a round of ~7 steps).

The round already gives SGLang the host bound of the prefixes it plans from (``seq_lens_cpu``
= the committed prefix bound + the width, as SGLang's own DFLASH draft-extend plan does). So
each captured verify-mode wrapper's ``begin_forward`` becomes ``fast_prefill_plan``, exactly as
SGLang installs it for draft extend (``FlashInferAttnBackend.init_forward_metadata_out_graph``):
the drafter's block forward and the width-1 verify (no custom mask) take it as is; a tree
verify (a custom-mask buffer) takes ``MaskedFastPlan``, which first packs the mask into the
wrapper's buffers on the GPU (``ddtree.maskpack_triton``, what FlashInfer's plan does with a
sync), then calls ``fast_prefill_plan``. On by default since its H200 runs (seeded and greedy
outputs token-identical, docs/gpu-results.md §22); ``SGLANG_DFLASH_DDTREE_FAST_PLAN=0`` turns it
off; ``=check`` also compares, every round, the host bound against the device lengths
(``bound_violation``; one sync a round).
"""

from __future__ import annotations

from functools import partial
from typing import Any


def backend_reason(backend: Any) -> str | None:
    """Why ``backend`` cannot take the fast plan (one line), or None when it can."""
    if not isinstance(getattr(backend, "prefill_cuda_graph_metadata", None), dict):
        return f"{type(backend).__name__} is not SGLang's FlashInfer backend"
    if getattr(backend, "prefill_backend", None) != "fa2":
        return f"FlashInfer prefill backend {getattr(backend, 'prefill_backend', None)!r}, not fa2"
    if getattr(backend, "dispatch_reason", "unknown") is not None:
        return f"wrapper dispatch {getattr(backend, 'dispatch_reason', 'unknown')} (SWA/cross)"
    return None


def wrapper_reason(wrapper: Any, plan_fn) -> str | None:
    """Why one captured wrapper cannot take the fast plan, or None when it can."""
    if not getattr(wrapper, "is_cuda_graph_enabled", False):
        return "not a CUDA-graph wrapper"
    if getattr(wrapper, "_backend", None) != "fa2":
        return f"wrapper backend {getattr(wrapper, '_backend', None)!r}, not fa2"
    if getattr(wrapper, "_cached_module", None) is None:
        return "not planned at capture"
    if getattr(getattr(wrapper, "begin_forward", None), "func", None) is plan_fn:
        return "already installed"
    return None


# The keywords SGLang adds for ``fast_prefill_plan`` (FlashInfer's own plan takes none of them).
HOST_LAYOUT = ("qo_indptr_host", "kv_indptr_host", "kv_lens_host", "max_q_len", "max_kv_len")


class MaskedFastPlan:
    """``begin_forward`` of a masked (tree) verify wrapper: the custom mask packed into the
    wrapper's ``custom_mask_buf`` / ``mask_indptr_buf`` on the GPU, then ``fast_prefill_plan``.

    ``func`` is ``fast_prefill_plan`` itself because SGLang's updater hands a wrapper the host
    layout (``qo_indptr_host`` ... ``max_kv_len``) only when ``begin_forward.func`` is that
    function (``call_begin_forward``, sglang 0.5.17). A call without a mask (an idle batch's
    replay) keeps FlashInfer's own plan."""

    def __init__(self, wrapper: Any, plan_fn, pack_fn, upstream):
        self.wrapper, self.func, self._pack, self._upstream = wrapper, plan_fn, pack_fn, upstream

    def __call__(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                 num_qo_heads, num_kv_heads, head_dim_qk, page_size, *args, custom_mask=None,
                 **kwargs):
        positional = (qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                      num_qo_heads, num_kv_heads, head_dim_qk, page_size, *args)
        if custom_mask is None:
            rest = {k: v for k, v in kwargs.items() if k not in HOST_LAYOUT}
            return self._upstream(*positional, custom_mask=None, **rest)
        self._pack(custom_mask, qo_indptr, paged_kv_indptr, paged_kv_last_page_len, page_size,
                   self.wrapper._custom_mask_buf, self.wrapper._mask_indptr_buf,
                   int(kwargs["max_q_len"]) * int(kwargs["max_kv_len"]))
        return self.func(self.wrapper, *positional, custom_mask=None, **kwargs)


class FencedPlan:
    """A wrapper's sync-free ``begin_forward`` that does not overwrite its host plan buffer
    while the GPU may still be reading it.

    FlashInfer's plan writes its scheduling arrays into the wrapper's page-locked
    ``_pin_memory_int_workspace_buffer`` and queues an asynchronous copy of them to the device.
    FlashInfer's own plan reads ``qo_indptr`` back first, a sync that has always let that copy
    finish; without the sync the host can plan the next step (or, since the no-draft round
    publishes its lengths early, a whole round) before the GPU has copied the previous plan,
    and the copy would then carry the newer plan, torn or for another batch. So each call first
    waits on the event recorded after the previous call on this wrapper (the GPU has *started*
    that step: the host stays up to a step ahead per wrapper), then plans and records a new
    one. ``func`` is the plan function, which is how SGLang's updater recognises it."""

    def __init__(self, inner, plan_fn, event_factory):
        self._inner, self.func, self._event = inner, plan_fn, event_factory
        self._pending = None

    def __call__(self, *args, **kwargs):
        if self._pending is not None:
            self._pending.synchronize()
        out = self._inner(*args, **kwargs)
        ev = self._event()
        ev.record()
        self._pending = ev
        return out


def install(backend: Any, plan_fn, pack_fn=None, fence=None) -> tuple[int, str | None]:
    """Install ``plan_fn`` (SGLang's ``fast_prefill_plan``) on every eligible captured verify
    wrapper of ``backend``, and ``MaskedFastPlan`` on the masked ones when ``pack_fn`` is
    given; ``fence`` (an event factory, e.g. ``torch.cuda.Event``) wraps each in
    ``FencedPlan``: (wrappers installed, the first reason one was not, or None)."""
    reason = backend_reason(backend)
    if reason is not None:
        return 0, reason
    installed, first = 0, None
    for bs in sorted(backend.prefill_cuda_graph_metadata):
        for w in backend.prefill_cuda_graph_metadata[bs]:
            why = wrapper_reason(w, plan_fn)
            masked = getattr(w, "_custom_mask_buf", None) is not None
            if why is None and masked and pack_fn is None:
                why = "has a custom-mask buffer (a masked verify) and no mask packer"
            if why is None:
                inner = (MaskedFastPlan(w, plan_fn, pack_fn, w.begin_forward)
                         if masked else partial(plan_fn, w))
                w.begin_forward = (FencedPlan(inner, plan_fn, fence) if fence is not None
                                   else inner)
                installed += 1
            elif first is None:
                first = f"bs {bs}: {why}"
    return installed, first


def pack_custom_mask(mask, qo_indptr, kv_indptr, last_page_len, page_size: int, out,
                     out_indptr, max_block_bits: int) -> None:
    """What FlashInfer's plan does with a custom mask in CUDA-graph mode, without its sync:
    the bit offsets from the page layout, the packed blocks into ``out`` (the wrapper's
    ``custom_mask_buf``), their byte offsets into ``out_indptr`` (``mask_indptr_buf``)."""
    from sglang_dflash.ddtree import maskpack_triton as mp

    bits = mp.mask_bit_indptr(qo_indptr, kv_indptr, last_page_len, page_size)
    mp.pack_triton(mask.contiguous().view(-1), bits, out, out_indptr, max_block_bits)


def warm_up_pack(device) -> None:
    """Compile the mask pack kernel at start-up, not in the first tree round (a 3-bit block
    into a scratch buffer)."""
    import torch

    mask = torch.ones(3, dtype=torch.bool, device=device)
    qo = torch.tensor([0, 1], dtype=torch.int32, device=device)
    kv = torch.tensor([0, 3], dtype=torch.int32, device=device)
    last = torch.ones(1, dtype=torch.int32, device=device)
    out = torch.zeros(8, dtype=torch.uint8, device=device)
    pack_custom_mask(mask, qo, kv, last, 1, out, torch.zeros(2, dtype=torch.int32,
                                                             device=device), 3)


def bound_violation(device_prefix, host_prefix, reserved, width: int) -> str | None:
    """Where a plan's host bound would be below the device: the fast plan reads kv lengths
    from the host, and a bound below the real length would cut a request's attention short.
    ``device_prefix``: the committed prefixes (read back, CPU); ``host_prefix``: the batch's
    ``seq_lens_cpu`` (or None), to which every plan adds its own width; ``reserved``:
    ``reserved_seq_lens_cpu``, used as the kv bound as it is, so it must hold the widest
    forward of the round (``width``: the larger of the draft block and the verify). One line
    naming the first rows, or None when every bound holds."""
    dev = [int(x) for x in device_prefix.tolist()]
    if host_prefix is not None:
        host = [int(x) for x in host_prefix.tolist()][:len(dev)]
        what = "seq_lens_cpu"
    elif reserved is not None:
        host = [int(x) - int(width) for x in reserved.tolist()][:len(dev)]
        what = f"reserved_seq_lens_cpu - {int(width)}"
    else:
        return None  # the round reads the lengths back itself
    bad = [(i, d, h) for i, (d, h) in enumerate(zip(dev, host, strict=False)) if d > h]
    if len(host) < len(dev):
        bad.append((len(host), dev[len(host)], None))
    if not bad:
        return None
    rows = ", ".join(f"row {i}: device {d} > host {h}" for i, d, h in bad[:3])
    return f"fast plan host bound below the device prefix ({what}; {len(bad)} row(s)): {rows}"
