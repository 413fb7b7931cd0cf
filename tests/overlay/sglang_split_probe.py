"""Runs INSIDE the SGLang CPU env with TRITON_INTERPRET=1 and SGLANG_DFLASH_DDTREE_BUDGET set:
the split tree verify (``SGLANG_DFLASH_DDTREE_SPLIT_VERIFY=1``) through the real hook code.

* ``hooks.graph_spec_info`` on a stand-in graph runner: what a split capture gets (a DDTree
  verify input without a mask, its visibility a view of the runner's buffer);
* ``DDTreeVerifyInput.generate_attn_arg_prefill``: the paged layout covers the prefixes only
  (SGLang's own Triton kv-indices kernel, interpreted);
* ``hooks.split_verify`` (FlashInfer's ``forward_extend`` around hook) on a stand-in backend whose
  paged wrapper attends over the kv indices it was planned with and returns FlashInfer's
  (output, base-2 lse): the verify tokens' KV saved at their slots, the output equal to the
  unsplit masked attention; and the refusals.
Prints one ``PROBE-JSON`` object.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from probe_output import report  # a sibling: the scripts run from this directory


def main() -> dict:
    import torch

    from sglang_dflash.ddtree import tree_attn_triton as ta
    from sglang_dflash.ddtree.tree import build_tree
    from sglang_dflash.sglang_overlay import hooks, split_verify
    from sglang_dflash.sglang_overlay.worker import DDTreeVerifyInput

    out: dict = {}
    g = torch.Generator().manual_seed(11)
    bs, width, heads, kv_heads, dim = 3, 5, 4, 2, 16
    prefix = torch.tensor([6, 1, 9])
    slots_per_row = 32

    # --- the capture's spec info --------------------------------------------------------
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput

    runner = SimpleNamespace(
        captured_req_width=width, max_bs=4, buffers=SimpleNamespace(custom_mask="MASK-BUF"),
        model_runner=SimpleNamespace(device=torch.device("cpu"), is_draft_worker=False,
                                     spec_algorithm=SimpleNamespace(is_dflash=lambda: True)))

    def original(self, num_tokens):
        return DFlashVerifyInput(draft_token=None, positions=None, draft_token_num=width,
                                 custom_mask=None)

    cap = hooks.graph_spec_info(original, runner, 2 * width)
    buf = runner._ddtree_split_visibility
    out["capture"] = {
        "type": type(cap).__name__, "custom_mask": cap.custom_mask,
        "vis_shape": list(cap.split_visibility.shape), "buf_numel": buf.numel(),
        "vis_is_buf_view": cap.split_visibility.data_ptr() == buf.data_ptr(),
        "again_same_buf": split_verify.visibility_buffer(runner, width) is buf,
    }
    runner1 = SimpleNamespace(**{**vars(runner), "captured_req_width": 1})
    del runner1._ddtree_split_visibility
    one = hooks.graph_spec_info(original, runner1, 2)
    out["capture_width1"] = {"type": type(one).__name__, "custom_mask": one.custom_mask,
                             "has_buf": hasattr(runner1, "_ddtree_split_visibility")}

    # --- a round's visibility into the runner's buffer (worker._verify_inputs) -----------
    vis = torch.rand(2, width, width, generator=g) < 0.5
    split_verify.fill_visibility(runner, vis, width)
    other = torch.zeros_like(buf)
    other_runner = SimpleNamespace(captured_req_width=width + 1,
                                   _ddtree_split_visibility=other)
    split_verify.fill_visibility(other_runner, vis, width)  # another width: untouched
    split_verify.fill_visibility(None, vis, width)  # no graphs: nothing to copy
    out["fill"] = {"copied": bool(torch.equal(buf[:vis.numel()], vis.reshape(-1))),
                   "tail_untouched": not bool(buf[vis.numel():].any()),
                   "other_width_untouched": not bool(other.any())}

    # --- the paged layout: prefixes only -------------------------------------------------
    logp = torch.log_softmax(torch.randn(bs, width - 1, 3, generator=g), -1)
    ids = torch.randint(0, 50, (bs, width - 1, 3), generator=g)
    tree = build_tree(logp, ids, torch.zeros(bs, dtype=torch.long), prefix, width - 1)
    req_to_token = torch.arange(8 * slots_per_row, dtype=torch.int32).view(8, slots_per_row)
    pool = torch.tensor([5, 2, 7])
    spec = DDTreeVerifyInput(draft_token=torch.zeros(bs * width, dtype=torch.long),
                             positions=torch.zeros(bs * width, dtype=torch.long),
                             draft_token_num=width, custom_mask=None)
    spec.split_visibility = tree.visibility
    host_sum = int((prefix + width).sum())
    kv_indices, kv_indptr, qo_indptr, mask = spec.generate_attn_arg_prefill(
        pool, prefix, host_sum, req_to_token)
    out["layout"] = {"kv_indptr": kv_indptr.tolist(), "qo_indptr": qo_indptr.tolist(),
                     "mask": mask,
                     "kv_indices": kv_indices[: int(kv_indptr[-1])].tolist(),
                     "expected_indices": torch.cat([req_to_token[p, :n] for p, n in
                                                    zip(pool, prefix, strict=True)]).tolist()}

    # --- the split forward_extend ---------------------------------------------------------
    n_slots = 8 * slots_per_row
    k_cache = torch.randn(n_slots, kv_heads, dim, generator=g)
    v_cache = torch.randn(n_slots, kv_heads, dim, generator=g)
    cache_loc = torch.cat([req_to_token[p, n:n + width] for p, n in
                           zip(pool, prefix, strict=True)]).long()
    q = torch.randn(bs * width, heads * dim, generator=g)
    k = torch.randn(bs * width, kv_heads, dim, generator=g)
    v = torch.randn(bs * width, kv_heads, dim, generator=g)
    scale = dim ** -0.5
    saved = []

    class Pool:
        def set_kv_buffer(self, layer, loc, kk, vv, *scales):
            saved.append((loc.loc.tolist() if hasattr(loc, "loc") else None, scales))
            k_cache[loc.loc] = kk
            v_cache[loc.loc] = vv

        def get_kv_buffer(self, layer_id):
            return (k_cache, v_cache)

    class Wrapper:
        def __init__(self):
            self.calls = []

        def forward_return_lse(self, qq, kv, causal, sm_scale, k_scale, v_scale):
            self.calls.append({"causal": causal, "sm_scale": sm_scale,
                               "q_shape": list(qq.shape)})
            kc, vc = kv
            kp = [kc[kv_indices[int(kv_indptr[r]):int(kv_indptr[r + 1])].long()]
                  for r in range(bs)]
            vp = [vc[kv_indices[int(kv_indptr[r]):int(kv_indptr[r + 1])].long()]
                  for r in range(bs)]
            return ta.prefix_attn_reference(qq, kp, vp, width, sm_scale)

    wrapper = Wrapper()
    backend = SimpleNamespace(
        token_to_kv_pool=Pool(), prefill_uses_dequant_workspace=False,
        forward_metadata=SimpleNamespace(prefill_wrappers=[wrapper], swa_out_cache_loc=None,
                                         multi_item_params=None),
        _get_wrapper_idx=lambda layer: 0, _kv_write_scales=lambda layer: ())
    layer = SimpleNamespace(tp_q_head_num=heads, tp_k_head_num=kv_heads, head_dim=dim,
                            scaling=scale, k_scale_float=None, v_scale_float=None, logit_cap=0.0,
                            sliding_window_size=-1, is_cross_attention=False, layer_id=0)
    fb = SimpleNamespace(forward_mode=SimpleNamespace(is_target_verify=lambda: True),
                         spec_info=spec, out_cache_loc=cache_loc)
    upstream = []
    got = hooks.split_verify(lambda *a, **kw: upstream.append(1), backend, q, k, v, layer, fb)
    kp = [k_cache[req_to_token[p, :n].long()] for p, n in zip(pool, prefix, strict=True)]
    vp = [v_cache[req_to_token[p, :n].long()] for p, n in zip(pool, prefix, strict=True)]
    want = ta.tree_attn_reference(q.view(-1, heads, dim), k, v, tree.visibility, kp, vp, scale)
    out["forward"] = {
        "shape": list(got.shape), "max_err": float((got.view(-1, heads, dim) - want).abs().max()),
        "upstream_calls": len(upstream), "wrapper": wrapper.calls,
        "saved_at": saved[0][0] == cache_loc.tolist(),
        "kv_in_cache": bool(torch.equal(k_cache[cache_loc], k)),
    }
    # not a split verify: upstream's
    fb_plain = SimpleNamespace(forward_mode=SimpleNamespace(is_target_verify=lambda: True),
                               spec_info=SimpleNamespace(), out_cache_loc=cache_loc)
    hooks.split_verify(lambda *a, **kw: upstream.append(2), backend, q, k, v, layer, fb_plain)
    out["plain_goes_upstream"] = upstream == [2]
    refusals = {}
    for name, over in (("softcap", {"logit_cap": 30.0}), ("window", {"sliding_window_size": 4}),
                       ("cross", {"is_cross_attention": True})):
        bad = SimpleNamespace(**{**vars(layer), **over})
        try:
            hooks.split_verify(lambda *a, **kw: None, backend, q, k, v, bad, fb)
            refusals[name] = None
        except Exception as exc:
            refusals[name] = f"{type(exc).__name__}: {exc}"
    fp8 = SimpleNamespace(**{**vars(backend), "token_to_kv_pool": SimpleNamespace(
        dtype=torch.float8_e4m3fn)})
    try:
        hooks.split_verify(lambda *a, **kw: None, fp8, q, k, v, layer, fb)
        refusals["fp8"] = None
    except Exception as exc:
        refusals["fp8"] = f"{type(exc).__name__}: {exc}"
    out["refusals"] = refusals
    out["finite"] = bool(torch.isfinite(got).all()) and not math.isnan(out["forward"]["max_err"])
    return out


if __name__ == "__main__":
    report(main)
