"""Runs INSIDE the SGLang CPU env: what SGLang's scheduler decides about copying each round's
lengths to the host, asked of the real DDTree worker class in SGLang's own order.

``Scheduler.init_model_worker`` constructs the draft worker first and builds the attention
backends after it (``init_all_attention_backends``); ``init_overlap`` then reads the worker's
``spec_v2_attn_backends`` once and ORs their ``needs_cpu_seq_lens`` (sglang 0.5.17
``managers/overlap_utils.decide_needs_cpu_seq_lens``). Deciding at construction saw no backend
(§30: FlashInfer stayed on the bound). Prints one ``PROBE-JSON`` object.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

from probe_output import report  # a sibling: the scripts run from this directory


def _worker(W, env: dict[str, str]):
    """A DDTree worker as SGLang has just constructed it: runners, no attention backend yet."""
    w = object.__new__(W.DDTreeWorkerV2)
    w._target_worker = SimpleNamespace(model_runner=SimpleNamespace())
    w.draft_model_runner = SimpleNamespace()
    w._fast_plan = "on"
    w._split_verify = False
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("SGLANG_DFLASH")}
    os.environ.update(env)
    try:
        w._init_host_lens()  # what __init__ runs
    finally:
        for k in env:
            os.environ.pop(k, None)
        os.environ.update(saved)
    return w


def _build(w, target, draft) -> None:
    """``init_all_attention_backends``: the backends appear on the runners."""
    w._target_worker.model_runner.attn_backend = target
    w.draft_model_runner.attn_backend = draft


def main() -> dict:
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.managers.overlap_utils import decide_needs_cpu_seq_lens

    from sglang_dflash.sglang_overlay import settings
    from sglang_dflash.sglang_overlay import worker as W

    plain = SimpleNamespace(enable_two_batch_overlap=False, speculative_algorithm="DFLASH")
    tbo = SimpleNamespace(enable_two_batch_overlap=True, speculative_algorithm="DFLASH")
    fi = (object.__new__(FlashInferAttnBackend), object.__new__(FlashInferAttnBackend))
    tr = (object.__new__(TritonAttnBackend), object.__new__(TritonAttnBackend))
    out: dict = {"flashinfer_needs": bool(FlashInferAttnBackend.needs_cpu_seq_lens),
                 "triton_needs": bool(getattr(TritonAttnBackend, "needs_cpu_seq_lens", False))}

    w = _worker(W, {})
    out["before_backends"] = w._resolved_host_lens()  # asked too early: sync, not kept
    _build(w, *fi)
    backends = w.spec_v2_attn_backends
    out["unset_flashinfer"] = decide_needs_cpu_seq_lens(plain, backends)
    out["unset_flashinfer_mode"] = w._resolved_host_lens()
    out["unset_flashinfer_wraps"] = [getattr(b, "backend", b) is ref
                                     for b, ref in zip(backends, fi, strict=True)]

    w = _worker(W, {})
    _build(w, *tr)
    out["unset_triton"] = decide_needs_cpu_seq_lens(plain, w.spec_v2_attn_backends)
    out["unset_triton_mode"] = w._resolved_host_lens()
    out["unset_triton_tbo"] = decide_needs_cpu_seq_lens(tbo, w.spec_v2_attn_backends)
    w = _worker(W, {})
    _build(w, tr[0], fi[1])
    out["triton_and_flashinfer_drafter"] = w._resolved_host_lens()

    w = _worker(W, {settings.HOST_LENS_ENV: "sync"})
    _build(w, *tr)
    out["sync_triton"] = decide_needs_cpu_seq_lens(plain, w.spec_v2_attn_backends)

    w = _worker(W, {settings.HOST_LENS_ENV: "bound"})
    _build(w, *fi)
    try:
        w._resolved_host_lens()
        out["bound_flashinfer"] = "accepted"
    except settings.DDTreeConfigError as exc:
        out["bound_flashinfer"] = str(exc)
    w = _worker(W, {settings.HOST_LENS_ENV: "bound"})
    _build(w, fi[0], tr[1])  # FlashInfer target, Triton drafter: the padded verify
    out["bound_flashinfer_target"] = [w._resolved_host_lens(), w._pad_verify]
    w = _worker(W, {})
    _build(w, *fi)
    w._resolved_host_lens()
    out["unset_flashinfer_padded"] = w._pad_verify
    w = _worker(W, {settings.HOST_LENS_ENV: "bound"})
    _build(w, *tr)
    w._resolved_host_lens()
    out["bound_triton_padded"] = w._pad_verify

    # the padded verify's prefixes (worker._padded_prefixes): P = the host bound - W on the
    # device, their sum, and the columns a mask row clears (from the committed lengths the
    # host has seen; the longest P without them)
    import torch

    w.device = torch.device("cpu")
    bound = torch.tensor([40, 25, 90])
    reqs = [SimpleNamespace(kv_committed_len=c) for c in (20, 10, 70)]
    dev, total, pad_max = w._padded_prefixes(SimpleNamespace(reqs=reqs), bound, 8)
    out["padded_prefixes"] = [dev.tolist(), total, pad_max]
    dev, total, pad_max = w._padded_prefixes(SimpleNamespace(), bound, 8)
    out["padded_prefixes_no_reqs"] = [dev.tolist(), total, pad_max]
    return out


if __name__ == "__main__":
    report(main)
