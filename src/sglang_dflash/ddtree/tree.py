"""Best-first DDTree construction under a node budget, batched over requests, on device.

The tree is the N most probable prefixes (prefix score = sum of per-depth log-probs) with depth
<= L: what the reference's best-first heap pops (DDTree paper, Prop. 2/3). Instead of N
sequential heap pops (N dependent steps, each several kernel launches) it takes O(L) steps of
about six batched ops each:

1. Per-depth beam. The depth-d nodes of the answer are among the N best depth-d prefixes, and
   those extend the N best depth-(d-1) prefixes: an extension never scores higher than its
   parent, and a better parent's rank-0 child beats every child of a worse parent. Of the
   parent at beam position a only ranks r with (a+1)(r+1) <= N can make the top N, so each
   depth is one top-N over about N*ln(N) candidates.
2. The answer is the top N of the union of the beams, ordered by the heap key. Best-first pops
   follow that key (a child or later sibling never precedes its parent or earlier sibling),
   so the order is the pop order: node indices, parents and LCRS links equal the heap
   reference's, ties included.

Heap key (the tie rule): score desc, then depth asc, then the parent's pop order, then rank.
Breaking ties by the parent's order (rather than liranringel/ddtree's rank-tuple comparison,
which gives the same tree unless two scores are bit-identical) makes step 1 exact even when
float32 rounding creates ties: a better parent's child never loses a tie to a worse parent's.
Ties are broken by stable sorts over a fixed candidate layout, so every device gives the same
tree. No host syncs: all shapes are static in (bs, L, K, N); the loops run over L on the host.

On the GPU these ~150 small ops are launch-bound, so ``build_tree`` sends CUDA tensors to
``tree_triton`` (one kernel: the N best-first pops in registers, same key, same tree bit for
bit); ``build_tree_torch`` stays the reference and the CPU path.
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass

import torch

from sglang_dflash.sglang_overlay import settings


@dataclass(frozen=True)
class DDTree:
    """A batch of draft trees, width W = N+1; node 0 is the root (the bonus token).

    Nodes are in pop order (parent index < child index). Rows past ``num_nodes`` are padding
    (only when fewer than N finite-probability prefixes exist): parent -1, depth 0, rank -1,
    token 0, visibility self-only, unlinked.
    """

    tokens: torch.Tensor  # [bs, W] int64
    parents: torch.Tensor  # [bs, W] int64, root and padding -1
    depths: torch.Tensor  # [bs, W] int64
    ranks: torch.Tensor  # [bs, W] int64, rank of the token at its depth; root 0, padding -1
    scores: torch.Tensor  # [bs, W] float32 prefix log-prob; root 0, padding -inf
    visibility: torch.Tensor  # [bs, W, W] bool, ancestor-or-self
    retrieve_index: torch.Tensor  # [bs, W] int64, b*W+i
    next_token: torch.Tensor  # [bs, W] int64 first child (local index) or -1
    next_sibling: torch.Tensor  # [bs, W] int64 next sibling (local index) or -1
    positions: torch.Tensor  # [bs, W] int64, seq_len + depth
    valid: torch.Tensor  # [bs, W] bool
    num_nodes: torch.Tensor  # [bs] int64, valid nodes including the root
    max_depth: int  # L

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]


def _candidate_pairs(n: int, p: int, k: int, dev) -> tuple[torch.Tensor, ...]:
    """(parent beam position a, child rank r, a*K + r) with (a+1)(r+1) <= n, built on device.

    The child of rank r of the parent at position a is beaten by the (a+1)(r+1)-1 pairs
    a' <= a, r' <= r (score at least as high, and the key breaks ties toward them), so only
    these can reach the top n: about n*ln(n) candidates instead of n*K. The count is a
    host-side integer, so shapes stay static.
    """
    total = sum(min(k, n // (a + 1)) for a in range(p))
    per = torch.clamp(n // (torch.arange(p, device=dev) + 1), max=k)
    starts = torch.cumsum(per, 0) - per
    a_idx = torch.repeat_interleave(torch.arange(p, device=dev), per, output_size=total)
    r_idx = torch.arange(total, device=dev) - starts.gather(0, a_idx)
    return a_idx, r_idx, a_idx * k + r_idx


IMPL_ENV = settings.IMPL_ENV


def use_triton(t: torch.Tensor) -> bool:
    """CUDA tensors take the DDTree Triton kernels unless ``SGLANG_DFLASH_DDTREE_IMPL=torch``
    (the tree builder, the verify mask and the accept tail all follow this one switch)."""
    return t.is_cuda and os.environ.get(IMPL_ENV, "auto") != "torch"


@functools.cache
def triton_module(name: str):
    """The Triton kernel module ``name`` (dotted), or None where triton cannot be imported.
    Asked once per module: a failed import is not cached by Python and would be retried on
    every call of a hot path."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def verify_kernels():
    """``verify_triton`` (the fused verify mask and accept tail), or None without triton."""
    return triton_module("sglang_dflash.ddtree.verify_triton")


def build_tree(
    logp: torch.Tensor,
    ids: torch.Tensor,
    root_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    budget: int,
) -> DDTree:
    """Select the ``budget`` best prefixes from per-depth top-K log-probs ``[bs, L, K]``.

    ``logp`` rows must be log-probabilities (<= 0, finite or -inf) sorted descending, as
    ``topk_logprobs`` returns them; ``-inf`` entries are impossible tokens, never selected.

    CUDA tensors go to the one-launch Triton kernel when triton imports (the torch path is
    launch-bound there); everything else, or ``SGLANG_DFLASH_DDTREE_IMPL=torch``, takes the
    torch path. Both give bit-identical trees.
    """
    if use_triton(logp):
        kernel = triton_module("sglang_dflash.ddtree.tree_triton")
        if kernel is not None:
            return kernel.build_tree_triton(logp, ids, root_tokens, seq_lens, budget)
    return build_tree_torch(logp, ids, root_tokens, seq_lens, budget)


def warm_up_inputs(depth: int, k: int, device) -> tuple[torch.Tensor, ...]:
    """Valid ``build_tree`` inputs for one request (logp, ids, root, seq_len): a start-up call
    compiles the Triton kernel before the first decode round needs it."""
    logp = -torch.arange(k, dtype=torch.float32, device=device).repeat(1, depth, 1)
    ids = torch.arange(k, device=device).repeat(1, depth, 1)
    one = torch.ones(1, dtype=torch.long, device=device)
    return logp, ids, one, one


def check_inputs(logp: torch.Tensor, ids: torch.Tensor, budget: int) -> tuple[int, int, int]:
    """Shared argument checks of both implementations; returns (bs, L, K)."""
    if logp.dim() != 3 or ids.shape != logp.shape:
        raise ValueError(f"logp/ids must be [bs, L, K] of one shape, got {logp.shape}/{ids.shape}")
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    bs, depth_max, k = logp.shape
    if depth_max < 1 or k < 1:
        raise ValueError(f"logp needs L >= 1 and K >= 1, got {tuple(logp.shape)}")
    return bs, depth_max, k


def build_tree_torch(
    logp: torch.Tensor,
    ids: torch.Tensor,
    root_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    budget: int,
) -> DDTree:
    """The torch implementation of ``build_tree``: the reference and the CPU path."""
    bs, depth_max, k = check_inputs(logp, ids, budget)
    dev = logp.device
    logp = logp.float()
    n = budget
    pairs: dict[int, tuple[torch.Tensor, ...]] = {}
    slots = torch.arange(n, device=dev).expand(bs, -1)

    # ---- 1. per-depth beams of width N, each in key order ---------------------------------
    # Candidates are laid out parent-major (a*K + r), so a stable descending sort breaks score
    # ties by (parent position, rank): the heap key, without building one. Scores are never
    # -0.0 (they start at +0.0 and only add values <= 0), so no signed-zero ties arise.
    prev = torch.zeros(bs, 1, device=dev)  # depth 0: the root, score 0
    scores_d, picks_d = [], []
    for d in range(depth_max):
        p = prev.shape[1]
        if p not in pairs:
            pairs[p] = _candidate_pairs(n, p, k, dev)
        a_idx, r_idx, ar_idx = (t.expand(bs, -1) for t in pairs[p])
        cand = prev.gather(1, a_idx) + logp[:, d, :].gather(1, r_idx)
        m = min(n, a_idx.shape[1])
        sc, pos = torch.sort(cand, dim=1, descending=True, stable=True)
        sc, pick = sc[:, :m], ar_idx.gather(1, pos[:, :m])
        if m < n:  # too few candidates (K^d < N): pad with impossible nodes, ranked last
            sc = torch.cat([sc, torch.full((bs, n - m), float("-inf"), device=dev)], 1)
            pick = torch.cat([pick, slots[:, : n - m] + p * k], 1)
        prev = sc
        scores_d.append(sc)
        picks_d.append(pick)

    # ---- 2. the answer: global top-N by (score desc, depth asc, beam slot asc) -----------
    # Best-first pops follow this key, so its sorted order is the pop order. Flat position
    # t = (depth-1)*N + slot is exactly (depth, slot) order, so a stable sort applies it.
    sc_all = torch.cat(scores_d, dim=1)  # [bs, L*N]
    pick_all = torch.cat(picks_d, dim=1)
    tot = depth_max * n
    sel_sc, sel = torch.sort(sc_all, dim=1, descending=True, stable=True)
    sel_sc, sel = sel_sc[:, :n], sel[:, :n]
    sel_ok = torch.isfinite(sel_sc)
    sel_pick = pick_all.gather(1, sel)
    sel_rank = sel_pick % k
    sel_depth = sel // n + 1
    # parent in ext index space (0 = root, 1 + flat position); padding picks may point past
    # the beam, so clamp (those nodes are invalid and masked below)
    sel_par_ext = torch.where(sel_depth == 1, 0, (sel_depth - 2) * n + 1 + sel_pick // k)
    sel_par_ext = sel_par_ext.clamp(max=tot)
    out_of_ext = torch.full((bs, tot + 1), -1, dtype=torch.long, device=dev)
    out_of_ext[:, 0] = 0
    out_of_ext.scatter_(1, sel + 1, torch.where(sel_ok, slots + 1, -1))
    sel_par = out_of_ext.gather(1, sel_par_ext)
    sel_tok = ids.reshape(bs, depth_max * k).long().gather(1, (sel_depth - 1) * k + sel_rank)

    # int64 fields as one [4, bs, W] block (each [bs, W] slice stays contiguous); invalid
    # (padding) nodes get token 0, parent -1, depth 0, rank -1
    body = torch.stack([sel_tok, sel_par, sel_depth, sel_rank])
    fill = -(torch.arange(4, device=dev) % 2).view(4, 1, 1)
    zeros = torch.zeros(bs, dtype=torch.long, device=dev)
    root = torch.stack([root_tokens.to(device=dev, dtype=torch.long), zeros - 1, zeros, zeros])
    block = torch.cat([root.unsqueeze(2), torch.where(sel_ok, body, fill)], dim=2)
    tokens, parents, depths, ranks = block.unbind(0)
    ones = torch.ones(bs, 1, dtype=torch.bool, device=dev)
    scores = torch.cat([zeros.view(bs, 1).float(), sel_sc], 1)
    valid = torch.cat([ones, sel_ok], 1)
    return _finish(tokens, parents, depths, ranks, scores, valid, seq_lens, depth_max)


def _finish(tokens, parents, depths, ranks, scores, valid, seq_lens, depth_max) -> DDTree:
    """Derive visibility, LCRS links, positions and indices from the parent array."""
    bs, width = tokens.shape
    dev = tokens.device
    ar = torch.arange(width, device=dev).expand(bs, -1)
    # ancestor chase: L gathers; the root and padding point at themselves
    up = torch.where(parents >= 0, parents, ar)
    chain = [ar]
    cur = ar
    for _ in range(depth_max):
        cur = up.gather(1, cur)
        chain.append(cur)
    anc = torch.stack(chain, dim=2)  # [bs, W, L+1]
    vis = torch.zeros(bs, width, width, dtype=torch.bool, device=dev)
    vis.scatter_(2, anc, True)

    # first child: min child index per parent (dummy column W for root/padding)
    par_c = torch.where(parents >= 0, parents, width)
    first = torch.full((bs, width + 1), width, dtype=torch.long, device=dev)
    first = first.scatter_reduce(1, par_c, ar, reduce="amin", include_self=True)[:, :width]
    next_token = torch.where(first < width, first, -1)
    # next sibling: sort by (parent, index); successor with the same parent
    order = torch.sort(par_c * (width + 1) + ar, dim=1).indices
    sp = par_c.gather(1, order)
    succ = torch.cat([order[:, 1:], torch.full((bs, 1), -1, dtype=torch.long, device=dev)], 1)
    same = torch.cat([sp[:, 1:] == sp[:, :-1], torch.zeros(bs, 1, dtype=torch.bool, device=dev)], 1)
    sib_sorted = torch.where(same & (sp < width), succ, -1)
    next_sibling = torch.empty_like(sib_sorted).scatter_(1, order, sib_sorted)

    positions = seq_lens.to(device=dev, dtype=torch.long).unsqueeze(1) + depths
    retrieve_index = ar + torch.arange(bs, device=dev).unsqueeze(1) * width
    return DDTree(
        tokens=tokens,
        parents=parents,
        depths=depths,
        ranks=ranks,
        scores=scores,
        visibility=vis,
        retrieve_index=retrieve_index.contiguous(),
        next_token=next_token,
        next_sibling=next_sibling,
        positions=positions,
        valid=valid,
        num_nodes=valid.sum(1),
        max_depth=depth_max,
    )


def chain_tree(
    logp: torch.Tensor, ids: torch.Tensor, root_tokens: torch.Tensor, seq_lens: torch.Tensor
) -> DDTree:
    """The drafter's rank-0 chain as a tree of width L+1: DFLASH's draft block.

    Node d is the top token at depth d, child of node d-1; its visibility row is the causal
    one, so a verify of it needs no mask (the chain rung of the adaptive policy verifies it as
    DFLASH does, causal). A depth whose top token is impossible (-inf) ends the chain there:
    it and the nodes under it are padding, as ``build_tree`` pads. No host sync."""
    bs, depth_max, _ = check_inputs(logp, ids, 1)
    dev = logp.device
    top = logp[:, :, 0].float()
    scores = torch.cat([torch.zeros(bs, 1, device=dev), top.cumsum(1)], 1)
    valid = torch.isfinite(scores)
    ar = torch.arange(depth_max + 1, device=dev).expand(bs, -1)
    tokens = torch.cat([root_tokens.to(device=dev, dtype=torch.long).view(bs, 1),
                        ids[:, :, 0].to(device=dev, dtype=torch.long)], 1)
    tokens = torch.where(valid, tokens, 0)
    parents = torch.where(valid & (ar > 0), ar - 1, -1)
    depths = torch.where(valid, ar, 0)
    ranks = torch.where(valid, 0, -1)
    scores = torch.where(valid, scores, float("-inf"))
    return _finish(tokens, parents, depths, ranks, scores, valid, seq_lens, depth_max)


def root_tree(root_tokens: torch.Tensor, seq_lens: torch.Tensor, max_depth: int) -> DDTree:
    """The budget-0 tree: the root (bonus token) alone, width 1.

    Verifying it is a plain decoding step (the target's choice after the root is the one
    committed token), so an adaptive round that stops paying for a draft runs through the same
    verify, walk and commit code as every other round. ``max_depth`` stays the drafter's L so
    the walk's outputs keep their ``[bs, L+1]`` shape.
    """
    bs = root_tokens.shape[0]
    dev = root_tokens.device
    col = torch.zeros(bs, 1, dtype=torch.long, device=dev)
    none = torch.full((bs, 1), -1, dtype=torch.long, device=dev)
    return DDTree(
        tokens=root_tokens.long().reshape(bs, 1).contiguous(),  # SGLang's walk needs it
        parents=none,
        depths=col,
        ranks=col,
        scores=torch.zeros(bs, 1, dtype=torch.float32, device=dev),
        visibility=torch.ones(bs, 1, 1, dtype=torch.bool, device=dev),
        retrieve_index=torch.arange(bs, dtype=torch.long, device=dev).view(bs, 1),
        next_token=none,
        next_sibling=none,
        positions=seq_lens.long().view(bs, 1).to(dev),
        valid=torch.ones(bs, 1, dtype=torch.bool, device=dev),
        num_nodes=torch.ones(bs, dtype=torch.long, device=dev),
        max_depth=int(max_depth),
    )
