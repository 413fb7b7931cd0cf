"""The tree block of a split verify attention, merged with the prefix's, in one Triton launch.

A tree verify's queries see (a) their request's whole committed prefix and (b) their ancestors
and themselves among the request's W tree nodes. FlashInfer's custom-mask kernel reads a mask
bit for every (query, key) pair over the prefix too: on the H200 at bs 32 it took 2.85 ms a
step where the causal kernel DFLASH runs took 1.16 ms (docs/gpu-results.md §20). Split, (a) is
a plain unmasked attention over the prefix (FlashInfer, returning its log-sum-exp), and (b) is
this kernel: each program takes one request's W nodes for one KV head (its G query heads),
scores them against the request's own W keys under the W x W visibility, and folds the
prefix's normalised output ``o_prefix`` with its base-2 log-sum-exp ``lse_prefix`` (FlashInfer's
convention: ``log2 sum 2^(s log2 e)``) into the softmax over both parts:

    o = (2^(L - m) o_prefix + sum_j 2^(t_j - m) v_j) / (2^(L - m) + sum_j 2^(t_j - m))

with ``t_j`` the visible tree scores in base 2, ``L`` the prefix's lse, ``m`` the larger of the
two maxima. An empty prefix (``L = -inf``) contributes nothing. ``tree_attn_reference`` is the
unsplit masked attention in torch; the tests compare under the Triton interpreter.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _tree_attn_kernel(
    q_ptr, k_ptr, v_ptr,  # [bs*W, H, D], [bs*W, Hkv, D], [bs*W, Hkv, D]
    vis_ptr,  # [bs, W, W] uint8 (bool): node i sees node j
    o_pre_ptr, lse_pre_ptr,  # [bs*W, H, D], [bs*W, H] float32 (base 2)
    out_ptr,  # [bs*W, H, D]
    qk_scale,  # sm_scale * log2(e)
    q_stride_t, q_stride_h, k_stride_t, k_stride_h, v_stride_t, v_stride_h,
    o_stride_t, o_stride_h, p_stride_t, p_stride_h, l_stride_t, l_stride_h,
    W: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
    BLOCK_W: tl.constexpr, BLOCK_R: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)  # request
    h = tl.program_id(1)  # KV head
    rows = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)  # (node, head-in-group) pairs
    node = rows // G
    qh = h * G + rows % G
    row_ok = node < W
    tok = r * W + node
    d = tl.arange(0, D)
    j = tl.arange(0, BLOCK_W)
    key_ok = j < W
    q = tl.load(q_ptr + tok[:, None] * q_stride_t + qh[:, None] * q_stride_h + d[None, :],
                mask=row_ok[:, None], other=0.0)
    kt = r * W + j
    k = tl.load(k_ptr + kt[:, None] * k_stride_t + h * k_stride_h + d[None, :],
                mask=key_ok[:, None], other=0.0)
    v = tl.load(v_ptr + kt[:, None] * v_stride_t + h * v_stride_h + d[None, :],
                mask=key_ok[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k)).to(tl.float32) * qk_scale  # [BLOCK_R, BLOCK_W], base 2
    vis = tl.load(vis_ptr + r * W * W + node[:, None] * W + j[None, :],
                  mask=row_ok[:, None] & key_ok[None, :], other=0)
    s = tl.where(vis != 0, s, float("-inf"))
    lse = tl.load(lse_pre_ptr + tok * l_stride_t + qh * l_stride_h, mask=row_ok,
                  other=float("-inf"))
    m = tl.maximum(tl.max(s, axis=1), lse)
    m = tl.where(m == float("-inf"), 0.0, m)  # a padded row: no scores, no prefix
    p = tl.exp2(s - m[:, None])
    w_pre = tl.exp2(lse - m)  # 0 for an empty prefix
    denom = tl.sum(p, axis=1) + w_pre
    o_pre = tl.load(o_pre_ptr + tok[:, None] * p_stride_t + qh[:, None] * p_stride_h + d[None, :],
                    mask=row_ok[:, None], other=0.0).to(tl.float32)
    o_pre = tl.where((w_pre > 0)[:, None], o_pre, 0.0)  # never 0 * (an empty prefix's NaN)
    acc = tl.dot(p.to(v.dtype), v).to(tl.float32) + w_pre[:, None] * o_pre
    denom = tl.where(denom > 0, denom, 1.0)
    out = acc / denom[:, None]
    tl.store(out_ptr + tok[:, None] * o_stride_t + qh[:, None] * o_stride_h + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def block_sizes(width: int, group: int) -> tuple[int, int]:
    """(BLOCK_W, BLOCK_R): the key block holds all W nodes (tl.dot needs >= 16); the row
    block covers at most 64 (node, head) rows, so one request's W * G rows take
    ceil(W * G / 64) programs."""
    block_w = max(16, triton.next_power_of_2(width))
    block_r = max(16, min(64, triton.next_power_of_2(width * group)))
    return block_w, block_r


def tree_attn_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visibility: torch.Tensor,
                     o_prefix: torch.Tensor, lse_prefix: torch.Tensor, sm_scale: float,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """``q`` [bs*W, H, D], ``k``/``v`` [bs*W, Hkv, D] (the verify tokens' own), ``visibility``
    [bs, W, W] bool, ``o_prefix`` [bs*W, H, D] and ``lse_prefix`` [bs*W, H] (float32, base 2)
    from an unmasked attention over each request's prefix: the verify's attention output."""
    bs, width = visibility.shape[0], visibility.shape[1]
    n_tok, heads, dim = q.shape
    kv_heads = k.shape[1]
    if n_tok != bs * width or heads % kv_heads or dim & (dim - 1) or dim < 16:
        raise ValueError(f"tree attention: q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"visibility {tuple(visibility.shape)}")
    group = heads // kv_heads
    # the kernel steps the head dimension by 1 (a slice of a fused qkv keeps that; a
    # transposed view would not)
    q, k, v, o_prefix = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, o_prefix))
    out = torch.empty_like(q) if out is None else out
    block_w, block_r = block_sizes(width, group)
    grid = (bs, kv_heads, triton.cdiv(width * group, block_r))
    if bs:
        _tree_attn_kernel[grid](
            q, k, v, visibility.view(torch.uint8), o_prefix, lse_prefix, out,
            float(sm_scale) * LOG2E,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1), o_prefix.stride(0), o_prefix.stride(1),
            lse_prefix.stride(0), lse_prefix.stride(1),
            W=width, G=group, D=dim, BLOCK_W=block_w, BLOCK_R=block_r,
        )
    return out


def prefix_attn_reference(q: torch.Tensor, k_prefix: list[torch.Tensor],
                          v_prefix: list[torch.Tensor], width: int, sm_scale: float):
    """What the unmasked prefix attention returns (FlashInfer's ``forward_return_lse``):
    per request's W queries, (normalised output [bs*W, H, D], base-2 lse [bs*W, H] float32);
    an empty prefix gives zeros and -inf."""
    heads, dim = q.shape[1], q.shape[2]
    outs, lses = [], []
    for r, (kp, vp) in enumerate(zip(k_prefix, v_prefix, strict=True)):
        qr = q[r * width:(r + 1) * width].float()  # [W, H, D]
        if kp.shape[0] == 0:
            outs.append(torch.zeros(width, heads, dim))
            lses.append(torch.full((width, heads), -math.inf))
            continue
        g = heads // kp.shape[1]
        kk = kp.float().repeat_interleave(g, dim=1)  # [P, H, D]
        vv = vp.float().repeat_interleave(g, dim=1)
        s = torch.einsum("whd,phd->hwp", qr, kk) * sm_scale
        lse = torch.logsumexp(s, dim=-1)  # [H, W], natural
        o = torch.einsum("hwp,phd->whd", torch.softmax(s, dim=-1), vv)
        outs.append(o)
        lses.append((lse / math.log(2)).transpose(0, 1))
    return torch.cat(outs).to(q.dtype), torch.cat(lses).float()


def tree_attn_reference(q, k, v, visibility, k_prefix, v_prefix, sm_scale) -> torch.Tensor:
    """The unsplit verify attention: each node over its prefix and its visible tree nodes."""
    bs, width = visibility.shape[0], visibility.shape[1]
    heads = q.shape[1]
    outs = []
    for r in range(bs):
        sl = slice(r * width, (r + 1) * width)
        g = heads // k.shape[1]
        keys = torch.cat([k_prefix[r], k[sl]]).float().repeat_interleave(g, dim=1)
        vals = torch.cat([v_prefix[r], v[sl]]).float().repeat_interleave(g, dim=1)
        s = torch.einsum("whd,khd->hwk", q[sl].float(), keys) * sm_scale
        p_len = k_prefix[r].shape[0]
        allowed = torch.cat([torch.ones(width, p_len, dtype=torch.bool), visibility[r].cpu()],
                            dim=1)
        s = s.masked_fill(~allowed.to(s.device), -math.inf)
        outs.append(torch.einsum("hwk,khd->whd", torch.softmax(s, dim=-1), vals))
    return torch.cat(outs).to(q.dtype)


def random_case(seed: int, prefixes, width: int, heads: int, kv_heads: int, dim: int,
                dtype=torch.float32, device="cpu"):
    """A real DDTree tree's visibility ``[bs, W, W]`` and seeded random q / k / v for the
    verify tokens and each request's prefix: (q, k, v, visibility, k_prefix, v_prefix), what
    the references above and the kernel take (the tests and ``scripts/gpu_split_numerics.py``)."""
    from sglang_dflash.ddtree.tree import build_tree

    g = torch.Generator().manual_seed(seed)
    bs = len(prefixes)
    depth = max(1, width - 1)
    logp = torch.log_softmax(torch.randn(bs, depth, 3, generator=g), -1)
    ids = torch.randint(0, 50, (bs, depth, 3), generator=g)
    tree = build_tree(logp, ids, torch.zeros(bs, dtype=torch.long), torch.tensor(prefixes),
                      width - 1)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    q = rnd(bs * width, heads, dim)
    k, v = rnd(bs * width, kv_heads, dim), rnd(bs * width, kv_heads, dim)
    kp = [rnd(p, kv_heads, dim) for p in prefixes]
    vp = [rnd(p, kv_heads, dim) for p in prefixes]
    return q, k, v, tree.visibility.bool().to(device), kp, vp

