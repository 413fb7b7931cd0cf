"""TEST-ONLY: ``plant.DevicePlant.apply`` in one Triton launch.

The planted draft source stands in for a drafter in GPU benchmarks, so what it costs a round
is charged to DDTree: as ~56 eager torch ops a round (counted on the CPU), it made planted
rounds pay host time a real drafter does not (docs/gpu-results.md §19). One program per
(request, depth) rewrites that top-K row exactly as ``DevicePlant.apply`` does (tested equal
under the Triton interpreter: tests/overlay/test_plant.py).

Import only where triton imports; for CPU development set ``TRITON_INTERPRET=1`` first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["L", "WC"])
def _plant_kernel(
    rows_ptr,  # [bs, 2] int64: plant request (or -1), prompt length
    seq_ptr,  # [bs] int64: committed prefix lengths
    roots_ptr,  # [bs] int64: the round's root (bonus) tokens
    ids_ptr,  # [bs, L, K] int64: the drafter's top-K ids
    logp_ptr,  # [bs, L, K]: their log-probs
    cont_ptr,  # [R, WC] int64: each request's continuation (-1 padding)
    ranks_ptr,  # [R, WC] int64: the rank to plant each continuation token at (-1: remove)
    clen_ptr,  # [R] int64: continuation lengths
    prof_ptr,  # [K]: the planted rows' log-probs (read when HAS_PROFILE)
    out_ids_ptr,  # [bs, L, K] int64
    out_logp_ptr,  # [bs, L, K]
    L,
    WC,
    HAS_PROFILE: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,  # next power of two >= K
    VP: tl.constexpr,  # next power of two >= K + 2 (filler candidates)
):
    b = tl.program_id(0)
    dd = tl.program_id(1)
    b64 = b.to(tl.int64)
    plan = tl.load(rows_ptr + 2 * b64)
    plen = tl.load(rows_ptr + 2 * b64 + 1)
    has = plan >= 0
    p = tl.maximum(plan, 0)
    cl = tl.load(clen_ptr + p)
    base = tl.load(seq_ptr + b64) - plen  # continuation index of the root token
    in_range = has & (base >= 0) & (base < cl)
    root_tok = tl.load(cont_ptr + p * WC + tl.minimum(tl.maximum(base, 0), WC - 1))
    ok = in_range & (root_tok == tl.load(roots_ptr + b64))
    j = base + dd + 1
    active = ok & (j < cl)
    jc = tl.minimum(tl.maximum(j, 0), WC - 1)
    tok = tl.load(cont_ptr + p * WC + jc)
    rank = tl.load(ranks_ptr + p * WC + jc)

    offs = tl.arange(0, KP)
    in_k = offs < K
    row_base = (b64 * L + dd) * K
    row = tl.load(ids_ptr + row_base + offs, mask=in_k, other=-1).to(tl.int64)
    match = (row == tok) & in_k
    present = tl.max(match.to(tl.int32), 0) > 0
    here = tl.min(tl.where(match, offs, KP), 0)  # first match (torch's argmax), 0 if none
    here = tl.where(present, here, 0)
    place = active & (rank >= 0) & (rank < K)
    remove = active & (~place) & present
    r = tl.minimum(tl.maximum(rank, 0), K - 1)
    at_rank = tl.sum(tl.where(offs == r, row, 0), 0)
    # the smallest id in 0..K+1 that is neither in the row nor the token (0 if none is free)
    v = tl.arange(0, VP)
    row_c = tl.minimum(tl.maximum(row, 0), K + 2)
    taken = tl.max(((row_c[:, None] == v[None, :]) & in_k[:, None]).to(tl.int32), 0) > 0
    taken = taken | (v == tl.minimum(tl.maximum(tok, 0), K + 2))
    free = (~taken) & (v < K + 2)
    filler = tl.min(tl.where(free, v, VP), 0)
    filler = tl.where(filler < VP, filler, 0).to(tl.int64)
    # the three writes of DevicePlant.apply, in its order (each reads the one before)
    out = tl.where((offs == here) & (place & present), at_rank, row)
    out = tl.where((offs == r) & place, tok, out)
    out = tl.where((offs == here) & remove, filler, out)
    tl.store(out_ids_ptr + row_base + offs, out, mask=in_k)
    lp = tl.load(logp_ptr + row_base + offs, mask=in_k, other=0.0)
    if HAS_PROFILE:
        planted_row = ok & (base + 1 < cl)
        prof = tl.load(prof_ptr + offs, mask=in_k, other=0.0)
        lp = tl.where(planted_row, prof, lp)
    tl.store(out_logp_ptr + row_base + offs, lp, mask=in_k)


def apply_triton(plant, rows, seq_lens, roots, logp, ids, profile):
    """``DevicePlant.apply`` for ``plant`` (its device tensors), one launch; ``profile`` = the
    planted rows' ``[K]`` log-probs in logp's dtype, or None."""
    bs, depth, k = ids.shape
    out_ids = torch.empty((bs, depth, k), dtype=torch.long, device=ids.device)
    out_logp = torch.empty_like(logp)
    if bs > 0 and depth > 0:
        _plant_kernel[(bs, depth)](
            rows.long().contiguous(), seq_lens.long().contiguous(), roots.long().contiguous(),
            ids.long().contiguous(), logp.contiguous(), plant.cont, plant.ranks, plant.clen,
            profile if profile is not None else logp, out_ids, out_logp,
            depth, plant.cont.shape[1], HAS_PROFILE=profile is not None,
            K=k, KP=triton.next_power_of_2(k), VP=triton.next_power_of_2(k + 2),
        )
    return out_logp, out_ids.to(ids.dtype)
