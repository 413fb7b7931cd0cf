"""Runs INSIDE the SGLang CPU env: what SGLang's scheduler decides about copying each round's
lengths to the host, asked of the real DDTree worker class.

``decide_needs_cpu_seq_lens`` (sglang 0.5.17 ``managers/overlap_utils.py``) ORs the
``needs_cpu_seq_lens`` of the worker's ``spec_v2_attn_backends``; the scheduler reads them once,
after the workers' CUDA graphs. Both backends here are SGLang's FlashInfer class (which needs
the lengths). Prints one ``PROBE-JSON`` object.
"""

from __future__ import annotations

from types import SimpleNamespace

from probe_output import report  # a sibling: the scripts run from this directory


def main() -> dict:
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
    from sglang.srt.managers.overlap_utils import decide_needs_cpu_seq_lens

    from sglang_dflash.sglang_overlay import worker as W

    target = object.__new__(FlashInferAttnBackend)
    draft = object.__new__(FlashInferAttnBackend)
    w = object.__new__(W.DDTreeWorkerV2)
    w._target_worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=target))
    w.draft_model_runner = SimpleNamespace(attn_backend=draft)
    plain = SimpleNamespace(enable_two_batch_overlap=False, speculative_algorithm="DFLASH")
    tbo = SimpleNamespace(enable_two_batch_overlap=True, speculative_algorithm="DFLASH")
    out: dict = {"flashinfer_needs": bool(FlashInferAttnBackend.needs_cpu_seq_lens)}
    from sglang_dflash.sglang_overlay import settings

    # unset on these (FlashInfer) backends resolves to sync, as the worker's __init__ does it
    fi = any(settings.is_flashinfer_backend(b) for b in (target, draft))
    out["flashinfer_detected"] = fi
    w._host_lens = settings.resolve_host_lens(settings.host_lens_from_env({}), "on", fi)
    out["unset"] = decide_needs_cpu_seq_lens(plain, w.spec_v2_attn_backends)
    # and on a backend that plans nothing from host lengths (the Triton backend's case)
    w._host_lens = settings.resolve_host_lens(settings.host_lens_from_env({}), "on", False)
    out["unset_not_flashinfer"] = decide_needs_cpu_seq_lens(plain, w.spec_v2_attn_backends)
    for mode in ("sync", "bound"):
        w._host_lens = mode
        backends = w.spec_v2_attn_backends
        out[mode] = decide_needs_cpu_seq_lens(plain, backends)
        out[f"{mode}_wraps"] = [getattr(b, "backend", b) is ref
                                for b, ref in zip(backends, (target, draft), strict=True)]
    out["bound_tbo"] = decide_needs_cpu_seq_lens(tbo, w.spec_v2_attn_backends)
    return out


if __name__ == "__main__":
    report(main)
