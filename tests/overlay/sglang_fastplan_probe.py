"""Runs INSIDE the SGLang CPU env with TRITON_INTERPRET=1: the sync-free verify plan through
SGLang 0.5.17's own FlashInfer updater (``FlashInferIndicesUpdaterPrefill.call_begin_forward``)
and its own ``fast_prefill_plan``, for a tree verify (``MaskedFastPlan``) and a width-1 verify
(``partial(fast_prefill_plan, w)``).

The wrapper is a stand-in carrying the CUDA-graph buffers FlashInfer's wrapper has (the real one
allocates on a GPU) and a ``_cached_module.plan`` that records what it is handed; everything
else is the real code path: SGLang's ``generate_attn_arg_prefill`` (kv indices by its Triton
kernel, the mask padded to the host bound), its dispatch on ``begin_forward.func``, our packer.
Prints one ``PROBE-JSON`` object: what the plan got, what landed in the buffers, and what
FlashInfer's own ``plan`` would have put there (``segment_packbits`` semantics).
"""

from __future__ import annotations

from types import SimpleNamespace

from probe_output import report  # a sibling: the scripts run from this directory


def stand_in_wrapper(torch, bs: int, max_bs: int, max_tokens: int, masked: bool):
    plans = []
    w = SimpleNamespace(
        is_cuda_graph_enabled=True, _backend="fa2", device=torch.device("cpu"),
        _max_total_num_rows=None,
        _cached_module=SimpleNamespace(plan=lambda *a: plans.append(a) or "plan-info"),
        # sized as SGLang's _create_prefill_wrappers slices them for the wrapper's bs
        _qo_indptr_buf=torch.zeros(bs + 1, dtype=torch.int32),
        _paged_kv_indptr_buf=torch.zeros(bs + 1, dtype=torch.int32),
        _paged_kv_last_page_len_buf=torch.zeros(bs, dtype=torch.int32),
        _paged_kv_indices_buf=torch.full((max_tokens,), -1, dtype=torch.int32),
        _float_workspace_buffer="float-ws", _int_workspace_buffer="int-ws",
        _pin_memory_int_workspace_buffer="pinned-ws",
        _custom_mask_buf=torch.full((max_tokens,), 0xEE, dtype=torch.uint8) if masked else None,
        # SGLang hands each per-bs wrapper cuda_graph_qk_indptr[i][: bs + 1]
        _mask_indptr_buf=torch.full((bs + 1,), -1, dtype=torch.int32) if masked else None,
    )
    w.begin_forward = lambda *a, **k: (_ for _ in ()).throw(AssertionError("upstream plan()"))
    return w, plans


class _NoEvent:
    """A CPU stand-in for torch.cuda.Event (the fence's factory): records and waits do nothing."""

    def record(self):
        pass

    def synchronize(self):
        pass


def run(torch, width: int, masked: bool, fenced: bool = False, padded: bool = False,
        graph_pad: bool = False) -> dict:
    from sglang.srt.layers.attention import flashinfer_backend as fib

    from sglang_dflash.ddtree import maskpack_triton as mp
    from sglang_dflash.ddtree.mask import full_mask, padded_full_mask
    from sglang_dflash.ddtree.tree import build_tree
    from sglang_dflash.sglang_overlay import fast_plan
    from sglang_dflash.sglang_overlay.worker import DDTreeVerifyInput

    bs, max_bs, slots = 3, 4, 64
    prefix = torch.tensor([5, 0, 17])  # the device's committed prefixes
    host = prefix + torch.tensor([0, 2, 1])  # the host bound: at or above them
    g = torch.Generator().manual_seed(width)
    req_to_token = torch.randperm(8 * slots, generator=g)[: 8 * slots].view(8, slots).int()
    pool = torch.tensor([6, 1, 3])
    mask = None
    if masked:
        depth, k = width - 1, 3
        logp = torch.log_softmax(torch.randn(bs, depth, k, generator=g), -1)
        ids = torch.randint(0, 90, (bs, depth, k), generator=g)
        tree = build_tree(logp, ids, torch.zeros(bs, dtype=torch.long), prefix, width - 1)
        mask = full_mask(tree, prefix, seq_lens_sum=int((host + width).sum()))
        if padded:  # the padded verify: the mask over P = host, the pad past each tree False
            mask = padded_full_mask(tree, prefix, host, int(host.sum()),
                                    int((host - prefix).max()))
    spec = DDTreeVerifyInput(draft_token=torch.zeros(bs * width, dtype=torch.long),
                             positions=torch.zeros(bs * width, dtype=torch.long),
                             draft_token_num=width, custom_mask=mask)
    if padded:
        spec.padded_lens = host
    if graph_pad:  # a replay padded to the captured bs 4: SGLang's fill length 1, host and device
        bs = 4
        pool, prefix, host = (torch.cat([t, torch.tensor([v])]) for t, v in
                              ((pool, 0), (prefix, 1), (host, 1)))
    w, plans = stand_in_wrapper(torch, bs, max_bs, 4096, masked)
    backend = SimpleNamespace(prefill_cuda_graph_metadata={bs: [w]}, prefill_backend="fa2",
                              dispatch_reason=None)
    installed = fast_plan.install(backend, fib.fast_prefill_plan, fast_plan.pack_custom_mask,
                                  fence=_NoEvent if fenced else None)
    updater = SimpleNamespace(
        req_to_token=req_to_token, kv_last_page_len=torch.ones(max_bs, dtype=torch.int32),
        num_qo_heads=4, num_kv_heads=2, head_dim=16, q_data_type=torch.bfloat16,
        data_type=torch.bfloat16)
    # what the round hands SGLang (_verify_inputs): seq_lens_cpu = the bound + the verify
    # width, seq_lens_sum (the updater's paged_kernel_lens_sum) = its sum
    seq_lens_cpu = host + width
    fib.FlashInferIndicesUpdaterPrefill.call_begin_forward(
        updater, None, w, pool, prefix, int(seq_lens_cpu.sum()), prefix, None, None,
        torch.zeros(max_bs + 1, dtype=torch.int32), torch.zeros(max_bs + 1, dtype=torch.int32),
        False, spec, seq_lens_cpu=seq_lens_cpu)
    out = {"installed": list(installed), "plans": len(plans),
           "begin_forward": type(w.begin_forward).__name__}
    if plans:
        a = plans[0]
        out["plan"] = {"qo_indptr_host": a[3].tolist(), "kv_indptr_host": a[4].tolist(),
                       "kv_lens_host": a[5].tolist(), "total_rows": a[6], "batch_size": a[7],
                       "heads": [a[8], a[9]], "page_size": a[10], "cuda_graph": a[11],
                       "causal": a[14], "workspaces": list(a[:3])}
    kv = (host if padded else prefix) + width
    out["device_kv_indptr"] = w._paged_kv_indptr_buf[: bs + 1].tolist()
    out["kv_indices_ok"] = all(
        w._paged_kv_indices_buf[int(s):int(s) + int(n)].tolist()
        == req_to_token[int(p), : int(n)].tolist()
        for s, n, p in zip(torch.cumsum(kv, 0) - kv, kv, pool, strict=True))
    out["expected_kv_indptr"] = [0, *torch.cumsum(kv, 0).tolist()]
    if masked:
        bits = mp.mask_bit_indptr(torch.arange(bs + 1) * width,
                                  torch.tensor([0, *torch.cumsum(kv, 0).tolist()]),
                                  torch.ones(bs, dtype=torch.int32), 1)
        ref, ref_indptr = mp.pack_reference(spec.custom_mask, bits)
        n = int(ref_indptr[-1])
        out["mask_indptr"] = w._mask_indptr_buf[: bs + 1].tolist()
        out["ref_mask_indptr"] = ref_indptr.tolist()
        out["mask_bytes_equal"] = bool(torch.equal(w._custom_mask_buf[:n], ref))
        out["mask_tail_untouched"] = bool((w._custom_mask_buf[n:] == 0xEE).all())
        out["mask_padded_to_host"] = int(spec.custom_mask.numel())
    return out


def main() -> dict:
    import torch

    return {"tree": run(torch, 6, True), "width1": run(torch, 1, False),
            "tree_padded": run(torch, 6, True, padded=True),
            "tree_padded_fenced": run(torch, 6, True, True, padded=True),
            "tree_padded_graph": run(torch, 6, True, padded=True, graph_pad=True),
            # as the worker installs it: each wrapped in the fence (fast_plan.FencedPlan)
            "tree_fenced": run(torch, 6, True, True), "width1_fenced": run(torch, 1, False, True)}


if __name__ == "__main__":
    report(main)
