"""The split tree verify (``SGLANG_DFLASH_DDTREE_SPLIT_VERIFY=1``): a tree verify's attention
as FlashInfer's unmasked paged attention over each request's prefix plus the W x W tree block.

FlashInfer's custom-mask kernel reads a mask bit for every (query, key) pair over the whole
prefix (2.85 ms a step at bs 32 on the H200 where the causal kernel takes 1.16 ms,
docs/gpu-results.md §20). Split: the verify input plans the paged attention over the prefix
alone (``worker.DDTreeVerifyInput.generate_attn_arg_prefill``), ``forward`` runs it with its
log-sum-exp and folds in the tree block (``ddtree/tree_attn_triton.py``). The verify graphs are
captured without a mask (``hooks.graph_spec_info``) and read the tree's visibility from their
runner's buffer (``visibility_buffer``), which each round fills before the replay
(``fill_visibility``, from ``worker.DDTreeWorkerV2._verify_inputs``); FlashInfer's
``forward_extend`` reaches ``forward`` through the around hook ``hooks.split_verify``.
"""

from __future__ import annotations

from sglang_dflash.sglang_overlay import settings


def visibility_buffer(runner, width: int):
    """The graph runner's ``[max_bs * W * W]`` bool buffer its split-verify graphs read the tree
    visibility from (made at its first capture; a round copies its tree's into it)."""
    buf = getattr(runner, "_ddtree_split_visibility", None)
    if buf is None:
        import torch

        buf = torch.zeros(int(runner.max_bs) * width * width, dtype=torch.bool,
                          device=runner.model_runner.device)
        runner._ddtree_split_visibility = buf
    return buf


def fill_visibility(runner, visibility, width: int) -> None:
    """Copy a round's tree visibility ``[bs, W, W]`` into ``runner``'s buffer when its graphs
    are split verifies of this width (padded rows keep stale values; their outputs are
    dropped). No buffer (no graphs, another width, an eager forward): nothing to copy."""
    buf = getattr(runner, "_ddtree_split_visibility", None)
    n = visibility.numel()
    if buf is not None and int(getattr(runner, "captured_req_width", 0) or 0) == width \
            and n <= buf.numel():
        buf[:n].copy_(visibility.reshape(-1))


def refusal(backend, layer, dtype=None) -> str | None:
    """Why this layer's tree verify cannot be split (one line), or None: the split runs
    FlashInfer's unmasked prefix attention and the tree block with the layer's own scale, so
    anything else that shapes the scores must be absent, and the tree block reads the verify
    tokens' keys as computed, so the KV cache must hold them in the same dtype."""
    kv_dtype = getattr(getattr(backend, "token_to_kv_pool", None), "dtype", None)
    if dtype is not None and kv_dtype is not None and kv_dtype != dtype:
        return f"a {kv_dtype} KV cache under {dtype} attention (a quantized KV cache)"
    if getattr(layer, "is_cross_attention", False):
        return "a cross-attention layer"
    if getattr(layer, "logit_cap", 0) and layer.logit_cap > 0:
        return f"logit soft-capping ({layer.logit_cap})"
    if getattr(layer, "sliding_window_size", -1) not in (None, -1):
        return f"a sliding window ({layer.sliding_window_size})"
    if getattr(backend, "prefill_uses_dequant_workspace", False):
        return "an FP4 KV cache (dequant workspace)"
    md = getattr(backend, "forward_metadata", None)
    mip = getattr(md, "multi_item_params", None)
    if mip is not None and mip.is_enabled():
        return "multi-item scoring"
    return None


def forward(backend, q, k, v, layer, forward_batch, vis, save_kv_cache=True):
    """One layer's split tree verify on ``backend`` (SGLang's FlashInfer backend): the verify
    tokens' KV saved as upstream saves it, FlashInfer's paged attention over the prefix without
    a mask, then the tree block folded in; ``[tokens, heads * head_dim]`` as upstream returns."""
    why = refusal(backend, layer, q.dtype)
    if why is not None:
        raise settings.DDTreeConfigError(
            f"{settings.SPLIT_VERIFY_ENV}=1 cannot split this target's verify: {why}; unset it")
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    from sglang_dflash.ddtree.tree_attn_triton import tree_attn_triton

    heads, kv_heads, dim = layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
    q = q.contiguous().view(-1, heads, dim)
    k = k.view(-1, kv_heads, dim)
    v = v.view(-1, kv_heads, dim)
    md = backend.forward_metadata
    if save_kv_cache:
        backend.token_to_kv_pool.set_kv_buffer(
            layer, KVWriteLoc(forward_batch.out_cache_loc, md.swa_out_cache_loc), k, v,
            *backend._kv_write_scales(layer))
    wrapper = md.prefill_wrappers[backend._get_wrapper_idx(layer)]
    o_pre, lse_pre = wrapper.forward_return_lse(
        q, backend.token_to_kv_pool.get_kv_buffer(layer.layer_id), causal=False,
        sm_scale=layer.scaling, k_scale=layer.k_scale_float, v_scale=layer.v_scale_float)
    out = tree_attn_triton(q, k.to(q.dtype), v.to(q.dtype), vis, o_pre, lse_pre, layer.scaling)
    return out.view(-1, heads * dim)
