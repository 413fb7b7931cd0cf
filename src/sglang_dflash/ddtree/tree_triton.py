"""Triton DDTree builder: one program per request, N sequential best-first pops in registers.

Same tree as ``tree.build_tree_torch`` (bit-identical, ties included) in one kernel launch
instead of ~150 torch ops, because on the GPU the torch path is launch-bound.

The frontier needs no heap. Popping the rank-r child of node i pushes at most two entries: the
rank-(r+1) child of i and the rank-0 child of the new node. So the frontier holds at most one
entry per popped node (its next unpopped child) and is an array indexed by node: ``cand[i]`` is
the score of node i's next child, ``nrank[i]`` its rank. Each pop is a block-wide argmax under
the documented key (score desc, depth asc, parent's pop order asc; rank never ties because an
entry is unique per parent): a max-reduction for the score, then a min-reduction of
``depth * WP + i`` over the entries holding that score, then one packed reduction for entry i's
rank and last child (for the sibling links). Scores are float32 sums in the same
order as the torch path (parent score + log-prob), so they are bit-identical.

Outputs (tokens, parents, depths, ranks, positions, retrieve index, LCRS links, scores, valid,
count and the bool ``[W, W]`` visibility) are all written by the same program; visibility is an
ancestor chase over the parent vector with ``tl.gather`` (registers, no global scratch).

Import this module only where triton is importable; ``tree.build_tree`` dispatches here for CUDA
tensors. For CPU development set ``TRITON_INTERPRET=1`` before importing it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .tree import DDTree, check_inputs

# int64 output fields, stored as one [8, bs, W] block (each [bs, W] slice contiguous)
_FIELDS = ("tokens", "parents", "depths", "ranks", "positions", "retrieve_index",
           "next_token", "next_sibling")


@triton.jit(do_not_specialize=["plane", "K"])
def _ddtree_kernel(
    logp_ptr,  # [bs, L, K] float32, rows sorted descending
    ids_ptr,  # [bs, L, K] any int
    root_ptr,  # [bs] int64
    seq_ptr,  # [bs] int64
    out_i64_ptr,  # [8, bs, W] int64 (see _FIELDS)
    scores_ptr,  # [bs, W] float32
    valid_ptr,  # [bs, W] bool
    vis_ptr,  # [bs, W, W] bool
    count_ptr,  # [bs] int64
    plane,  # bs * W: stride between the int64 fields; runtime ints are not specialised
    K,  # (do_not_specialize): one compile per (L, N) serves every batch size
    L: tl.constexpr,  # L, N, W are compile-time: loop bounds; one compile per (L, N)
    N: tl.constexpr,
    W: tl.constexpr,  # N + 1
    WP: tl.constexpr,  # next power of two >= W
    BR: tl.constexpr,  # visibility rows per block
):
    b = tl.program_id(0)
    offs = tl.arange(0, WP)
    neg_inf = float("-inf")
    lp_base = logp_ptr + b.to(tl.int64) * L * K

    is_root = offs == 0
    node_score = tl.where(is_root, 0.0, neg_inf)
    node_depth = tl.zeros([WP], dtype=tl.int32)
    node_par = tl.full([WP], -1, dtype=tl.int32)
    node_rank = tl.where(is_root, 0, -1)
    first = tl.full([WP], -1, dtype=tl.int32)  # first child (= next_token)
    nsib = tl.full([WP], -1, dtype=tl.int32)  # next sibling
    last = tl.full([WP], -1, dtype=tl.int32)  # last child popped so far
    nrank = tl.zeros([WP], dtype=tl.int32)  # rank of the frontier entry's child
    # frontier: cand[i] = score of node i's next child; lp_next[i] = log-prob of the child
    # after it (loaded one pop ahead, so no load sits between two argmaxes for siblings)
    cand = tl.where(is_root, tl.load(lp_base), neg_inf)
    lp01 = tl.load(lp_base + tl.minimum(1, K - 1))
    lp_next = tl.where(is_root, tl.where(K > 1, lp01, neg_inf), neg_inf)

    for step in range(N):
        j = step + 1
        m = tl.max(cand, 0)
        key = tl.where(cand == m, node_depth * WP + offs, 2147483647)
        kmin = tl.min(key, 0)
        i = kmin % WP
        pdepth = kmin // WP
        sel = offs == i
        # one reduction for entry i's child rank and last popped child
        packed = tl.max(tl.where(sel, (nrank.to(tl.int64) << 32) | (last + 1).to(tl.int64), -1), 0)
        hi = packed >> 32
        r = hi.to(tl.int32)
        prev = (packed - (hi << 32)).to(tl.int32) - 1
        # ok: a finite prefix is left. Kept as a vector: vector & vector is the only boolean
        # combination that both the compiler and the interpreter accept here.
        ok = (tl.zeros([WP], dtype=tl.float32) + m) > neg_inf
        at_j = (offs == j) & ok
        sel_ok = sel & ok
        # j's first child (-inf at depth L) and the one after it; addresses are clamped
        # instead of masked, so every load is in bounds
        row_j = tl.minimum(pdepth + 1, L - 1) * K
        child_lp = tl.where(pdepth + 1 < L, tl.load(lp_base + row_j), neg_inf)
        child_next = tl.load(lp_base + row_j + tl.minimum(1, K - 1))
        child_next = tl.where(pdepth + 1 < L, tl.where(K > 1, child_next, neg_inf), neg_inf)
        # i's child after the new next one (rank r + 2), needed only when i wins again
        r2 = r + 2
        sib2 = tl.load(lp_base + tl.minimum(pdepth, L - 1) * K + tl.minimum(r2, K - 1))
        sib2 = tl.where(r2 < K, sib2, neg_inf)
        # the new node j
        node_score = tl.where(at_j, m, node_score)
        node_depth = tl.where(at_j, pdepth + 1, node_depth)
        node_par = tl.where(at_j, i, node_par)
        node_rank = tl.where(at_j, r, node_rank)
        first = tl.where(sel_ok & (last < 0), j, first)
        nsib = tl.where((offs == prev) & ok, j, nsib)
        last = tl.where(sel_ok, j, last)
        # frontier: i advances to rank r + 1 (same float32 add as the torch path:
        # parent score + log-prob), j enters with its rank-0 child
        cand = tl.where(sel_ok, node_score + lp_next, cand)
        cand = tl.where(at_j, m + child_lp, cand)
        lp_next = tl.where(sel_ok, sib2, lp_next)
        lp_next = tl.where(at_j, child_next, lp_next)
        nrank = tl.where(sel_ok, r + 1, nrank)

    in_w = offs < W
    valid = node_rank >= 0
    d64 = node_depth.to(tl.int64)
    tok_off = b.to(tl.int64) * L * K + (d64 - 1) * K + node_rank
    tok = tl.load(ids_ptr + tok_off, mask=valid & (offs > 0) & in_w, other=0).to(tl.int64)
    tok = tl.where(is_root, tl.load(root_ptr + b), tok)
    row = b.to(tl.int64) * W + offs
    plane = plane.to(tl.int64)
    tl.store(out_i64_ptr + row, tok, mask=in_w)
    tl.store(out_i64_ptr + plane + row, node_par.to(tl.int64), mask=in_w)
    tl.store(out_i64_ptr + 2 * plane + row, d64, mask=in_w)
    tl.store(out_i64_ptr + 3 * plane + row, node_rank.to(tl.int64), mask=in_w)
    tl.store(out_i64_ptr + 4 * plane + row, tl.load(seq_ptr + b) + d64, mask=in_w)
    tl.store(out_i64_ptr + 5 * plane + row, row, mask=in_w)
    tl.store(out_i64_ptr + 6 * plane + row, first.to(tl.int64), mask=in_w)
    tl.store(out_i64_ptr + 7 * plane + row, nsib.to(tl.int64), mask=in_w)
    tl.store(scores_ptr + row, node_score, mask=in_w)
    tl.store(valid_ptr + row, valid, mask=in_w)
    tl.store(count_ptr + b, tl.sum((valid & in_w).to(tl.int64), 0))

    # visibility: row q sees its ancestors-or-self; root and padding point at themselves
    up = tl.where(node_par >= 0, node_par, offs)
    vis_base = vis_ptr + b.to(tl.int64) * W * W
    for start in range(0, W, BR):
        rows = start + tl.arange(0, BR)
        cur = tl.minimum(rows, WP - 1)
        acc = offs[None, :] == rows[:, None]
        for _ in range(L):
            cur = tl.gather(up, cur, 0)
            acc = acc | (offs[None, :] == cur[:, None])
        ptrs = vis_base + rows[:, None].to(tl.int64) * W + offs[None, :]
        tl.store(ptrs, acc, mask=(rows[:, None] < W) & in_w[None, :])


def _num_warps(wp: int) -> int:
    """One warp up to W = 128: every reduction of the pop loop stays in warp shuffles."""
    return 1 if wp <= 128 else (2 if wp <= 256 else 4)


def _rows(wp: int) -> int:
    """Visibility rows per block: a [rows, WP] tile of about 64 booleans per thread."""
    return max(1, min(wp, 64 * 32 * _num_warps(wp) // wp))


def build_tree_triton(
    logp: torch.Tensor,
    ids: torch.Tensor,
    root_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    budget: int,
) -> DDTree:
    """``build_tree`` in one Triton launch; same arguments, same tree as the torch path."""
    bs, depth_max, k = check_inputs(logp, ids, budget)
    dev = logp.device
    width = budget + 1
    wp = triton.next_power_of_2(width)
    out_i64 = torch.empty((len(_FIELDS), bs, width), dtype=torch.long, device=dev)
    scores = torch.empty((bs, width), dtype=torch.float32, device=dev)
    valid = torch.empty((bs, width), dtype=torch.bool, device=dev)
    vis = torch.empty((bs, width, width), dtype=torch.bool, device=dev)
    count = torch.empty((bs,), dtype=torch.long, device=dev)
    if bs > 0:
        _ddtree_kernel[(bs,)](
            logp.float().contiguous(), ids.contiguous(),
            root_tokens.to(device=dev, dtype=torch.long).contiguous(),
            seq_lens.to(device=dev, dtype=torch.long).contiguous(),
            out_i64, scores, valid, vis, count,
            bs * width, k,
            L=depth_max, N=budget, W=width, WP=wp, BR=_rows(wp), num_warps=_num_warps(wp),
        )
    f = dict(zip(_FIELDS, out_i64.unbind(0), strict=True))
    return DDTree(scores=scores, visibility=vis, valid=valid, num_nodes=count,
                  max_depth=depth_max, **f)
