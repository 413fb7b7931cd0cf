"""The accepted path's target KV moved to the linear slots in one Triton launch.

After a tree verify, the j-th committed token's KV sits in the slot of its tree node ``i``
(``out_cache_loc[b*W + i]``) and must move to ``req_to_token[pool[b], prefix[b] + j]``.
SGLang's ``move_accept_tokens_to_target_kvcache`` does it in about eight launches (two
zero-filled index lists, ``assign_extend_cache_locs``, ``fill_accept_out_cache_loc``, whose
programs each scan the whole list, then ``copy_all_layer_kv_cache_tiled``) and copies all
``bs * (L+1)`` entries, the padding and the root's in-place self-copy included: 1.4 ms of GPU
time a round at bs 32 on the H200 (docs/gpu-results.md §20). Here one program per (KV buffer,
byte tile, request) reads that request's accepted node slots and copies only the entries
whose node is not already in its slot (``i != j``), so a chain accepted along the tree's
first nodes, and every no-draft round, copies nothing.

Same result as SGLang's path for the buffers ``MHATokenToKVPool`` moves (its per-layer K and
V buffers, addressed as SGLang's own tiled copy addresses them: ``data_ptrs`` / ``data_strides``
/ ``_kv_copy_config``); ``compact_reference`` is that path in torch and the tests compare the
two under the Triton interpreter. In place is safe: a program loads all its request's rows
before it stores any, and requests own disjoint slots.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["W", "D1", "row_stride"])
def _compact_kernel(
    data_ptrs,  # [n_buffers] uint64: base address of each KV buffer
    strides,  # [n_buffers] int64: bytes per slot of each buffer
    out_cache_loc_ptr,  # [bs * W] int64: the verify's slot of every node
    req_to_token_ptr,  # [pool rows, row_stride] int32
    pool_idx_ptr,  # [bs] int64
    prefix_ptr,  # [bs] int64: committed prefix lengths before this round
    idx_ptr,  # [bs, D1] int32: accepted global node indices (b*W + i), root first, -1 pad
    len_ptr,  # [bs] int32: accepted drafts (the root excluded)
    W,
    D1,
    row_stride,
    DP: tl.constexpr,  # next power of two >= D1
    BYTES_PER_TILE: tl.constexpr,
):
    buf = tl.program_id(0)
    tile = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    stride = tl.load(strides + buf)
    base = tl.cast(tl.load(data_ptrs + buf), tl.pointer_type(tl.uint8))
    j = tl.arange(0, DP)
    n_acc = tl.load(len_ptr + b)
    node = tl.load(idx_ptr + b * D1 + j, mask=j < D1, other=-1).to(tl.int64)
    local = node - b * W
    move = (j < D1) & (j <= n_acc) & (node >= 0) & (local != j)
    src = tl.load(out_cache_loc_ptr + tl.maximum(node, 0), mask=move, other=0)
    pool = tl.load(pool_idx_ptr + b)
    pos = tl.load(prefix_ptr + b) + j
    tgt = tl.load(req_to_token_ptr + pool * row_stride + pos, mask=move, other=0).to(tl.int64)
    byte = tile * BYTES_PER_TILE + tl.arange(0, BYTES_PER_TILE)
    mask = move[:, None] & (byte < stride)[None, :]
    vals = tl.load(base + src[:, None] * stride + byte[None, :], mask=mask)
    tl.store(base + tgt[:, None] * stride + byte[None, :], vals, mask=mask)


def compact_triton(
    data_ptrs: torch.Tensor,
    data_strides: torch.Tensor,
    copy_config: dict,
    out_cache_loc: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    accept_index: torch.Tensor,
    accept_len: torch.Tensor,
    width: int,
) -> None:
    """Move every request's accepted KV rows to ``prefix .. prefix + accept_len`` (one launch).

    ``copy_config`` is the pool's ``_kv_copy_config`` (``bytes_per_tile``, ``byte_tiles``,
    ``num_warps``); ``accept_index`` / ``accept_len`` are the walk kernel's int32 outputs."""
    bs, d1 = accept_index.shape
    if bs == 0 or data_ptrs.numel() == 0:
        return
    grid = (data_ptrs.numel(), int(copy_config["byte_tiles"]), bs)
    _compact_kernel[grid](
        data_ptrs, data_strides, out_cache_loc.to(torch.long).contiguous(), req_to_token,
        req_pool_indices.to(torch.long).contiguous(), prefix_lens.to(torch.long).contiguous(),
        accept_index.contiguous(), accept_len.contiguous(),
        width, d1, req_to_token.stride(0),
        DP=triton.next_power_of_2(d1), BYTES_PER_TILE=int(copy_config["bytes_per_tile"]),
        num_warps=int(copy_config.get("num_warps", 4)),
    )


def compact_reference(
    buffers: list[torch.Tensor],
    out_cache_loc: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    accept_index: torch.Tensor,
    accept_len: torch.Tensor,
) -> None:
    """SGLang's ``move_accept_tokens_to_target_kvcache`` in torch: the packed target slots
    (``assign_extend_cache_locs`` over ``prefix .. prefix + accept_len``), the packed source
    slots (``fill_accept_out_cache_loc``: ``out_cache_loc`` at the valid ``accept_index``
    entries, in order), zeros past both, then every buffer's rows copied tgt <- src at once."""
    bs, d1 = accept_index.shape
    size = bs * d1
    tgt = torch.zeros(size, dtype=torch.long)
    src = torch.zeros(size, dtype=torch.long)
    t = 0
    for b in range(bs):
        n = int(accept_len[b]) + 1
        row = req_to_token[int(req_pool_indices[b])]
        start = int(prefix_lens[b])
        tgt[t:t + n] = row[start:start + n].long()
        t += n
    valid = accept_index.reshape(-1).long()
    valid = valid[valid >= 0]
    src[: valid.numel()] = out_cache_loc.long()[valid]
    for buf in buffers:
        buf[tgt] = buf[src].clone()
