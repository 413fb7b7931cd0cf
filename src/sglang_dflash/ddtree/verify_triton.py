"""Triton kernels for the two launch-bound pieces of a DDTree round around the verify forward.

A round is host-bound at small batch (docs/gpu-results.md §19: a DDTree round costs 1.5-2x a
DFLASH round at the same acceptance, with ~106 eager launches besides two graph launches), and
every torch op is a launch plus its Python dispatch. Two pieces are pure index arithmetic:

* ``full_mask_triton``: the tree blocks of the flat FULL_MASK (``mask.full_mask``: 14 launches
  in torch) in one kernel after the all-True fill.
* ``accept_tail_triton``: what follows SGLang's ``verify_tree_greedy`` (``verify.greedy_accept``'s
  dtype conversions, committed tokens, bonus, commit lengths: 12 launches) and, for the adaptive
  policy, the counterfactual counts (``adaptive.path_counts``: 10 more) in one kernel.

Both equal their torch versions element for element (tests/ddtree/test_verify_triton.py, under
the Triton interpreter on the CPU). One program per request; runtime sizes are not specialised,
so one compile per (width, depth) serves every batch size.

Import only where triton imports (``mask.full_mask`` and ``verify.greedy_accept`` dispatch here
for CUDA tensors); for CPU development set ``TRITON_INTERPRET=1`` before importing it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Candidate budgets the accept tail counts at most (a schedule slot's list, padded with -1).
MAX_COUNTED = 16
# Largest batch the mask kernel takes (larger batches use the torch path; SGLang's CUDA
# graphs stop far below this).
MASK_MAX_BS = 1024
_MASK_CHUNKS = tl.constexpr(MASK_MAX_BS // 64)  # read inside the kernel


@triton.jit(do_not_specialize=["bs", "W"])
def _full_mask_kernel(
    vis_ptr,  # [bs, W, W] bool: node i sees node j
    seq_ptr,  # [bs] int64: committed prefix lengths
    pad_ptr,  # [bs] int64: padded prefix lengths P >= seq (PADDED), else seq_ptr again
    out_ptr,  # flat bool FULL_MASK, already all True
    bs,
    W,
    WP: tl.constexpr,  # next power of two >= W
    PADDED: tl.constexpr,  # blocks [W, P + W], the columns past the tree block False
):
    b = tl.program_id(0)
    # axis 1: 0 writes the tree block; with PADDED, c >= 1 clears the (c-1)-th 64 columns
    # past it (a grid, not a loop: the bound is a runtime value and the interpreter needs
    # compile-time loop bounds; a grid size compiles nothing)
    c = tl.program_id(1)
    # the prefixes of the requests before b: masked loads over MASK_MAX_BS, so no size of
    # the batch is compiled in (a new batch size never triggers a compile mid-serving)
    prefix = tl.zeros([], dtype=tl.int64)
    chunk = tl.arange(0, 64)
    for k in tl.static_range(_MASK_CHUNKS):
        offs = k * 64 + chunk
        prefix += tl.sum(tl.load(pad_ptr + offs, mask=(offs < bs) & (offs < b), other=0), 0)
    s_b = tl.load(seq_ptr + b)
    p_b = tl.load(pad_ptr + b)
    w64 = W.to(tl.int64)
    base = w64 * prefix + b.to(tl.int64) * w64 * w64
    i = tl.arange(0, WP)[:, None]
    j = tl.arange(0, WP)[None, :]
    inside = (i < W) & (j < W)
    if c == 0:
        v = tl.load(vis_ptr + b.to(tl.int64) * w64 * w64 + i * W + j, mask=inside, other=0)
        # row i of request b starts at base + i * (p_b + W); its tree block after the prefix
        tl.store(out_ptr + base + i * (p_b + w64) + s_b + j, v, mask=inside)
    elif PADDED:  # the p_b - s_b columns after the tree block: KV slots it must not see
        col = (c - 1).to(tl.int64) * 64 + chunk[None, :]
        tl.store(out_ptr + base + i * (p_b + w64) + s_b + w64 + col,
                 tl.zeros([WP, 64], dtype=tl.int1), mask=(i < W) & (col < p_b - s_b))


def full_mask_triton(vis: torch.Tensor, seq_lens: torch.Tensor, seq_lens_sum: int,
                     padded_lens: torch.Tensor | None = None, pad_max: int = 0,
                     tail: int = 0) -> torch.Tensor:
    """``mask.full_mask(tree, seq_lens, seq_lens_sum=...)`` for width > 1: one fill, one kernel
    (one compile per width and layout). With ``padded_lens`` (``[bs]`` on the device, summing
    to ``seq_lens_sum``) the padded layout of ``mask.padded_full_mask``; ``pad_max`` is a host
    bound of the longest ``P - seq`` (the columns each row clears); ``tail`` True elements
    after the blocks."""
    bs, width, _ = vis.shape
    if bs > MASK_MAX_BS:
        raise ValueError(f"full_mask_triton takes at most {MASK_MAX_BS} requests, got {bs}")
    dev = vis.device
    out = torch.ones(int(seq_lens_sum) * width + bs * width * width + max(int(tail), 0),
                     dtype=torch.bool, device=dev)
    if bs > 0:
        seq = seq_lens.to(device=dev, dtype=torch.long).contiguous()
        pad = seq if padded_lens is None else \
            padded_lens.to(device=dev, dtype=torch.long).contiguous()
        chunks = 0 if padded_lens is None else -(-max(int(pad_max), 0) // 64)
        _full_mask_kernel[(bs, 1 + chunks)](
            vis.contiguous(), seq, pad, out, bs, width,
            WP=triton.next_power_of_2(width), PADDED=padded_lens is not None,
        )
    return out


@triton.jit(do_not_specialize=["W", "D1", "NB"])
def _accept_tail_kernel(
    pred_ptr,  # [bs * W] int32: the target's token after each node (verify_tree_greedy)
    idx_ptr,  # [bs, D1] int32: accepted global node indices, root first, -1 padding
    len_ptr,  # [bs] int32: accepted drafts
    budgets_ptr,  # [MAX_COUNTED] int64: counted budgets, -1 padding
    idx_out_ptr,  # [bs, D1] int64
    len_out_ptr,  # [bs] int64
    tok_out_ptr,  # [bs, D1] int64: committed tokens, bonus last, 0 past the commit
    commit_out_ptr,  # [bs] int32: accepted + 1
    bonus_out_ptr,  # [bs] int64
    counts_ptr,  # [bs, MAX_COUNTED] float32: path nodes with local index in 1..n, per budget
    W,
    D1,  # depth + 1
    NB,  # budgets in use (the rest of counts is not written)
    DP: tl.constexpr,  # next power of two >= D1
    NBP: tl.constexpr,  # MAX_COUNTED
    COUNT: tl.constexpr,
):
    b = tl.program_id(0)
    j = tl.arange(0, DP)
    in_d = j < D1
    row = b.to(tl.int64) * D1
    idx = tl.load(idx_ptr + row + j, mask=in_d, other=-1)
    n_acc = tl.load(len_ptr + b)
    tok = tl.load(pred_ptr + tl.maximum(idx, 0).to(tl.int64), mask=in_d & (idx >= 0), other=0)
    tok = tok.to(tl.int64)
    tl.store(idx_out_ptr + row + j, idx.to(tl.int64), mask=in_d)
    tl.store(tok_out_ptr + row + j, tok, mask=in_d)
    tl.store(bonus_out_ptr + b, tl.sum(tl.where(j == n_acc, tok, 0), 0))
    tl.store(len_out_ptr + b, n_acc.to(tl.int64))
    tl.store(commit_out_ptr + b, n_acc + 1)
    if COUNT:
        k = tl.arange(0, NBP)
        n = tl.load(budgets_ptr + k)
        local = tl.where(idx >= 0, idx.to(tl.int64) - b.to(tl.int64) * W, -1)
        local = tl.where(j >= 1, local, -1)  # the root is not a draft
        hit = (local[:, None] >= 1) & (local[:, None] <= n[None, :])
        c = tl.sum(hit.to(tl.float32), 0)
        tl.store(counts_ptr + b.to(tl.int64) * NBP + k, c, mask=k < NB)


def pad_budgets(budgets, device) -> torch.Tensor:
    """The counted budgets as the kernel reads them: int64 ``[MAX_COUNTED]``, -1 padding (made
    once per schedule slot and reused: a fresh host-to-device copy each round would cost a
    launch and wait for the stream)."""
    budgets = [int(n) for n in budgets]
    if len(budgets) > MAX_COUNTED:
        raise ValueError(f"at most {MAX_COUNTED} counted budgets, got {len(budgets)}")
    return torch.tensor(budgets + [-1] * (MAX_COUNTED - len(budgets)), dtype=torch.long,
                        device=device)


def accept_tail_triton(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_len: torch.Tensor,
    width: int,
    budgets: torch.Tensor | None = None,
    n_budgets: int = 0,
) -> tuple[torch.Tensor, ...]:
    """(accept_index int64, accept_len int64, out_tokens, commit_lens int32, bonus, counts):
    ``verify.greedy_accept``'s tail after the walk kernel, and ``adaptive.path_counts`` over
    the first ``n_budgets`` of ``budgets`` (``pad_budgets``' layout; counts is None when
    there are none). One launch, plus the counts' sum over the batch."""
    bs, d1 = accept_index.shape
    dev = accept_index.device
    idx_out = torch.empty((bs, d1), dtype=torch.long, device=dev)
    tok_out = torch.empty((bs, d1), dtype=torch.long, device=dev)
    len_out = torch.empty((bs,), dtype=torch.long, device=dev)
    commit = torch.empty((bs,), dtype=torch.int32, device=dev)
    bonus = torch.empty((bs,), dtype=torch.long, device=dev)
    count = budgets is not None and n_budgets > 0
    if count and (budgets.numel() != MAX_COUNTED or n_budgets > MAX_COUNTED):
        raise ValueError("budgets must be pad_budgets(...) output")
    per_req = torch.empty((max(bs, 1), MAX_COUNTED), dtype=torch.float32, device=dev)
    if bs > 0:
        _accept_tail_kernel[(bs,)](
            predicts.contiguous(), accept_index.contiguous(), accept_len.contiguous(),
            budgets if count else per_req,  # not read without COUNT
            idx_out, len_out, tok_out, commit, bonus, per_req,
            width, d1, n_budgets if count else 0,
            DP=triton.next_power_of_2(d1), NBP=MAX_COUNTED, COUNT=count,
        )
    counts = None
    if count:
        counts = (per_req[:bs, :n_budgets].sum(0) if bs
                  else torch.zeros(n_budgets, dtype=torch.float32, device=dev))
    return idx_out, len_out, tok_out, commit, bonus, counts


def warm_up(width: int, depth: int, device) -> None:
    """Compile both kernels for one verify width now (start-up), with and without counting,
    so no first round of a width or batch size compiles (triton compiles on first use)."""
    vis = torch.ones((1, width, width), dtype=torch.bool, device=device)
    seq = torch.ones(1, dtype=torch.long, device=device)
    full_mask_triton(vis, seq, 1)
    full_mask_triton(vis, seq, 2, padded_lens=seq + 1, pad_max=1)  # the padded verify's
    idx = torch.full((1, depth + 1), -1, dtype=torch.int32, device=device)
    idx[:, 0] = 0
    pred = torch.zeros(width, dtype=torch.int32, device=device)
    n_acc = torch.zeros(1, dtype=torch.int32, device=device)
    accept_tail_triton(pred, idx, n_acc, width)
    accept_tail_triton(pred, idx, n_acc, width, pad_budgets([1], device), 1)
