"""Tensor glue between a DDTree and SGLang's verify/accept/commit machinery.

Pure torch, batched, no host syncs, so it runs in the overlap scheduler and is unit-tested on
the CPU with small tensors. The worker passes SGLang's kernels in (``verify_tree_greedy``) so
this module never imports SGLang; without a kernel the DDTree core's ``greedy_walk`` (same
semantics) is used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import torch

from sglang_dflash.ddtree.mask import full_mask, padded_full_mask
from sglang_dflash.ddtree.tree import DDTree, root_tree, use_triton, verify_kernels
from sglang_dflash.ddtree.walk import greedy_walk


class VerifyTensors(NamedTuple):
    """What one target TARGET_VERIFY forward over a tree needs (flattened over the batch)."""

    tokens: torch.Tensor  # [bs*W] int64, node 0 of each request = its bonus token
    positions: torch.Tensor  # [bs*W] int64, prefix + depth
    custom_mask: torch.Tensor | None  # flat bool FULL_MASK; None = causal (width 1)


def build_verify_tensors(tree: DDTree, prefix_lens: torch.Tensor, host_seq_lens_sum: int,
                         masked: bool = True, padded_lens: torch.Tensor | None = None,
                         pad_max: int = 0, tail: int = 0):
    """Verify inputs for ``tree``; the mask is sized from the host upper bound of the prefixes.

    ``masked=False`` (a root-only tree, width 1) leaves the mask out: one query that sees its
    prefix and itself is exactly the causal mask. ``padded_lens`` (the padded verify, device
    ``[bs]`` summing to ``host_seq_lens_sum``; ``pad_max`` a host bound of the longest
    ``P - prefix``; ``tail`` True elements after it) lays the mask out over the padded
    prefixes (``mask.padded_full_mask``).

    SGLang's backends index the FULL_MASK with the device ``seq_lens`` (the committed prefixes)
    and size buffers from the host ``seq_lens_sum``, which overlap scheduling only knows as an
    upper bound. Sizing from that bound avoids a host sync; the unused tail stays True, which
    is how SGLang pads masks for CUDA graphs.
    """
    if padded_lens is not None:
        mask = padded_full_mask(tree, prefix_lens, padded_lens, int(host_seq_lens_sum), pad_max,
                                tail)
    else:
        mask = full_mask(tree, prefix_lens, seq_lens_sum=int(host_seq_lens_sum)) if masked \
            else None
    return VerifyTensors(tree.tokens.reshape(-1), tree.positions.reshape(-1), mask)


class PinnedRing:
    """Small host tensors to the device each round without a sync: a few page-locked slots
    used in turn, each copied asynchronously; a slot is refilled only once its last copy has
    run (its event), which, with the host at most a round or two ahead of the GPU, never
    waits. (A copy from pageable memory can synchronise the stream.) On a CPU device a plain
    copy."""

    def __init__(self, device, slots: int = 4) -> None:
        self.device = torch.device(device)
        self.slots = slots
        self._cap = 0
        self._host: list[torch.Tensor] = []
        self._dev: list[torch.Tensor] = []
        self._events: list = []
        self._i = 0

    def _grow(self, n: int) -> None:
        cap = max(n, 2 * self._cap, 64)
        pinned = self.device.type == "cuda"
        self._host = [torch.empty(cap, dtype=torch.int64, pin_memory=pinned)
                      for _ in range(self.slots)]
        self._dev = [torch.empty(cap, dtype=torch.int64, device=self.device)
                     for _ in range(self.slots)]
        self._events = [None] * self.slots
        self._cap = cap

    def to_device(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (host, int64) on the device, a view of this round's slot."""
        n = int(values.numel())
        if n > self._cap:
            if any(e is not None for e in self._events):  # the old slots' copies first
                torch.cuda.current_stream(self.device).synchronize()
            self._grow(n)
        i, self._i = self._i, (self._i + 1) % self.slots
        if self._events[i] is not None:
            self._events[i].synchronize()
        host, dev = self._host[i][:n], self._dev[i][:n]
        host.copy_(values.reshape(-1))
        dev.copy_(host, non_blocking=self.device.type == "cuda")
        if self.device.type == "cuda":
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            self._events[i] = ev
        return dev


def verify_slots(block_slots: torch.Tensor, width: int) -> torch.Tensor | None:
    """The verify's KV slots ``[bs*width]`` from the draft block's ``[bs, B]`` (both start at
    each request's prefix), or None when the verify is wider than the block."""
    if width > block_slots.shape[1]:
        return None
    # contiguous: kernels read the slots by pointer (a view of the whole block stays a view)
    return block_slots[:, :width].reshape(-1).contiguous()


class Acceptance(NamedTuple):
    accept_index: torch.Tensor  # [bs, L+1] int64 global node index (b*W+i), root first, -1 pad
    accept_len: torch.Tensor  # [bs] int64 accepted drafts (root excluded)
    out_tokens: torch.Tensor  # [bs, L+1] int64 committed tokens, bonus last, 0 past commit
    commit_lens: torch.Tensor  # [bs] int32 accept_len + 1
    bonus: torch.Tensor  # [bs] int64
    # adaptive.path_counts over the counted budgets, when the fused tail computed it (else None)
    counts: torch.Tensor | None = None
    # the walk kernel's own int32 accept_index / accept_len (KV compaction takes int32): kept
    # so they need not be converted back (None on the torch walk)
    index_i32: torch.Tensor | None = None
    len_i32: torch.Tensor | None = None


def committed_tokens(
    predicts: torch.Tensor, accept_index: torch.Tensor, accept_len: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens committed per request from ``verify_tree_greedy``'s flat ``predicts``.

    ``predicts[n]`` is the target's token after node n, so the j-th committed token is
    ``predicts[accept_index[:, j]]`` and the last one (j = accept_len) is the bonus.
    """
    idx = accept_index.long()
    valid = idx >= 0
    toks = predicts.long().reshape(-1)[idx.clamp(min=0)]
    out = torch.where(valid, toks, torch.zeros_like(toks))
    bonus = out.gather(1, accept_len.long().view(-1, 1)).view(-1)
    return out, bonus


def root_accept(choice: torch.Tensor, max_depth: int) -> Acceptance:
    """``greedy_accept`` of a budget-0 (root-only) tree, without the walk: the one committed
    token is the target's choice after the root. Two small ops instead of the walk kernel and
    its buffers: a no-draft round is pure overhead, so it gets the shortest path."""
    bs = choice.shape[0]
    first = choice.reshape(bs, 1).long()
    dev = first.device
    pad = max(0, int(max_depth))
    accept_index = torch.cat(
        [torch.arange(bs, dtype=torch.long, device=dev).view(bs, 1),
         torch.full((bs, pad), -1, dtype=torch.long, device=dev)], dim=1)
    out = torch.cat([first, torch.zeros((bs, pad), dtype=torch.long, device=dev)], dim=1)
    return Acceptance(
        accept_index,
        torch.zeros(bs, dtype=torch.long, device=dev),
        out,
        torch.ones(bs, dtype=torch.int32, device=dev),
        first.view(bs),
    )


class RootRound:
    """A budget-0 (no-draft) round's tree and acceptance for one batch size, with every tensor
    that does not depend on the round's tokens made once.

    A no-draft round competes with plain decoding, so its own work is kept to what depends on
    the round: the root tokens, the positions and the target's choice (two small ops instead
    of about twenty launches per round). The shared tensors are never written downstream: the
    walk kernel is not called for a root-only tree, compaction is skipped, the drafter's KV
    writer and ``path_counts`` only read them, and SGLang copies ``accept_lens`` to the host.
    Equal to ``root_tree`` + ``root_accept`` (tests/ddtree/test_adaptive_counts.py).
    """

    def __init__(self, bs: int, max_depth: int, device, steps: int = 1) -> None:
        zeros = torch.zeros(bs, dtype=torch.long, device=device)
        self._tree = root_tree(zeros, zeros, max_depth)
        self._accept = root_accept(zeros.view(bs, 1), max_depth)
        self._pad = self._accept.out_tokens[:, 1:]  # zeros [bs, L]
        self.bs = bs
        self._device = device
        self._commits: dict[int, torch.Tensor] = {}
        self.commit_lens(steps)

    def commit_lens(self, steps: int) -> torch.Tensor:
        """Commit lengths of a no-draft round of ``steps`` decode steps (the worker's
        ``_nodraft_round``: its k, or fewer near the requests' ends): int32 [bs], read by
        SGLang's result processing only; made once per step count (a fresh host-to-device
        copy each round would wait for the stream)."""
        hit = self._commits.get(steps)
        if hit is None:
            hit = self._commits[steps] = torch.full((self.bs,), int(steps), dtype=torch.int32,
                                                    device=self._device)
        return hit

    def tree(self, root_tokens: torch.Tensor, seq_lens: torch.Tensor) -> DDTree:
        bs = self.bs
        return dataclasses.replace(
            self._tree,
            tokens=root_tokens.long().reshape(bs, 1).contiguous(),
            positions=seq_lens.long().view(bs, 1),
        )

    def accept(self, choice: torch.Tensor) -> Acceptance:
        first = choice.reshape(self.bs, 1).long()
        return self._accept._replace(
            out_tokens=torch.cat([first, self._pad], dim=1), bonus=first.view(self.bs)
        )


def greedy_accept(
    tree: DDTree,
    target_predict: torch.Tensor,
    kernel: Callable | None = None,
    budgets: tuple[torch.Tensor, int] | None = None,
) -> Acceptance:
    """Walk ``tree`` with the target's per-node choice ``[bs, W]`` (argmax, or a sample at T>0).

    ``kernel`` is SGLang's ``verify_tree_greedy_func`` (CUDA); None uses the torch walk. On
    CUDA the walk's tail (dtype conversions, committed tokens, bonus) is one Triton launch
    (``verify_triton.accept_tail_triton``), which also counts ``budgets`` (``(pad_budgets(...),
    n)``, the adaptive policy's counterfactual) into ``counts``; elsewhere ``counts`` is None
    and the caller uses ``adaptive.path_counts``.
    """
    bs, width = tree.tokens.shape
    depth = tree.max_depth
    target_predict = target_predict.reshape(bs, width).long()
    if kernel is None:
        res = greedy_walk(tree, target_predict)
        out = torch.where(res.out_tokens >= 0, res.out_tokens, torch.zeros_like(res.out_tokens))
        return Acceptance(
            res.accept_index.long(),
            res.accept_len.long(),
            out,
            res.commit_lens.to(torch.int32),
            res.bonus.long(),
        )
    dev = tree.tokens.device
    predicts = torch.zeros(bs * width, dtype=torch.int32, device=dev)
    accept_index = torch.full((bs, depth + 1), -1, dtype=torch.int32, device=dev)
    accept_len = torch.zeros(bs, dtype=torch.int32, device=dev)
    predicts, accept_index, accept_len = kernel(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_len,
        candidates=tree.tokens.long(),
        retrieve_index=tree.retrieve_index.long(),
        retrieve_next_token=tree.next_token.long(),
        retrieve_next_sibling=tree.next_sibling.long(),
        target_predict=target_predict,
    )
    kernels = verify_kernels() if use_triton(accept_index) else None
    if kernels is not None:
        padded, n = budgets if budgets is not None else (None, 0)
        idx, n_acc, out, commit, bonus, counts = kernels.accept_tail_triton(
            predicts, accept_index, accept_len, width, padded, n)
        return Acceptance(idx, n_acc, out, commit, bonus, counts, accept_index, accept_len)
    out, bonus = committed_tokens(predicts, accept_index, accept_len)
    return Acceptance(
        accept_index.long(), accept_len.long(), out, (accept_len + 1).to(torch.int32), bonus,
        None, accept_index, accept_len,
    )


def gather_accepted_rows(x: torch.Tensor, accept_index: torch.Tensor) -> torch.Tensor:
    """Rows of node-indexed ``x`` ``[bs*W, ...]`` along the accepted paths: ``[bs*(L+1), ...]``.

    Padded entries (-1) read node 0 of the batch; they sit past each request's commit length,
    where the prefix-valid draft-KV writer never looks.
    """
    return x[accept_index.reshape(-1).long().clamp(min=0)]


def linear_positions(prefix_lens: torch.Tensor, width: int) -> torch.Tensor:
    """Positions of committed tokens after compaction: ``prefix + j`` for j < width, ``[bs, w]``."""
    j = torch.arange(width, device=prefix_lens.device, dtype=torch.int64)
    return prefix_lens.long().view(-1, 1) + j.view(1, -1)


def plan_bound(seq_lens_cpu: torch.Tensor | None, reserved_cpu: torch.Tensor | None,
               reserved_sum: int | None, width: int) -> tuple[torch.Tensor, int] | None:
    """The host bound of a forward's kv lengths that its FlashInfer plan reads, and its sum,
    without a sync: SGLang's host prefix lengths + the forward's ``width``; without them
    (``SGLANG_DFLASH_DDTREE_HOST_LENS=bound``: SGLang no longer copies them each round) the
    reserved lengths SGLang keeps on the host as they are (committed + 2 x (N+1), past any
    forward of the round, as SGLang's own DFLASH draft plans them); else None (the caller
    reads the device lengths back: a sync). A bound above the real length only plans work
    that finds nothing (fast_plan.py); one below would cut attention short."""
    if seq_lens_cpu is not None:
        bound = seq_lens_cpu.to(torch.int64) + int(width)
        return bound, int(bound.sum())
    if reserved_cpu is not None:
        total = int(reserved_sum) if reserved_sum is not None else int(reserved_cpu.sum())
        return reserved_cpu, total
    return None


def node_rows(t: torch.Tensor, bs: int, width: int, device) -> torch.Tensor:
    """A per-request ``[bs]`` (or ``[bs, 1]``) value repeated for each of its ``width`` tree
    nodes: ``[bs * width]``, row order as in the verify logits."""
    return t.reshape(bs).to(device).repeat_interleave(width)


def per_node_targets(
    logits: torch.Tensor,
    width: int,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor | None = None,
    top_ps: torch.Tensor | None = None,
    min_ps: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    renorm: tuple[Callable, Callable] | None = None,
) -> torch.Tensor:
    """One independent draw per tree node from the target's processed distribution, ``[bs, W]``.

    Following the child equal to the draw at every node makes each committed token an exact
    sample of the target (DDTree's lossless rule at T > 0). Per-request ``temperatures``,
    ``top_ks`` (>= vocab or <= 0 = off), ``top_ps`` and ``min_ps`` are ``[bs]`` or ``[bs, 1]``;
    SGLang encodes greedy requests as top_k = 1, which this honours exactly. ``renorm`` is
    sgl_kernel's ``(top_k_renorm_prob, top_p_renorm_prob)`` on CUDA (what EAGLE's verify uses);
    without it a torch sort does the same filtering. No host sync (see ``draw_rows``).
    """
    rows, vocab = logits.shape
    bs = rows // width

    def per_row(t: torch.Tensor | None, fill: float) -> torch.Tensor:
        if t is None:
            return torch.full((rows, 1), fill, device=logits.device)
        return node_rows(t, bs, width, logits.device).view(rows, 1)

    temp = per_row(temperatures, 1.0).float().clamp(min=1e-6)
    probs = torch.softmax(logits.float() / temp, dim=-1)
    if renorm is not None and (top_ks is not None or top_ps is not None):
        top_k_renorm, top_p_renorm = renorm
        if top_ks is not None:
            probs = top_k_renorm(probs, node_rows(top_ks, bs, width, logits.device))
        if top_ps is not None:
            probs = top_p_renorm(probs, node_rows(top_ps, bs, width, logits.device))
    elif top_ks is not None or top_ps is not None:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = torch.ones_like(sorted_p, dtype=torch.bool)
        if top_ks is not None:
            k = per_row(top_ks, vocab).long()
            k = torch.where(k <= 0, torch.full_like(k, vocab), k)
            ranks = torch.arange(vocab, device=logits.device).view(1, -1)
            keep &= ranks < k
        if top_ps is not None:
            p = per_row(top_ps, 1.0).float()
            before = sorted_p.cumsum(-1) - sorted_p
            keep &= before < p
        keep[:, 0] = True
        sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
        probs = torch.zeros_like(probs).scatter(1, order, sorted_p)
    if min_ps is not None:
        mp = per_row(min_ps, 0.0).float()
        probs = torch.where(probs >= mp * probs.max(-1, keepdim=True).values, probs, 0.0)
    return draw_rows(probs, logits, generator).view(bs, width)


SeededSampler = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def seeded_node_targets(
    logits: torch.Tensor,
    width: int,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    seeded: SeededSampler,
    top_ks: torch.Tensor | None = None,
    top_ps: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-node draws keyed by (request seed, node position), as SGLang's deterministic sampler
    draws the token after the same position, ``[bs, W]``.

    ``seeded`` is SGLang's ``multinomial_with_seed(logprobs, seeds, positions)`` (the worker
    passes it in; one hash, SGLang's). The float steps mirror ``Sampler`` under
    ``--enable-deterministic-inference``: softmax of ``logits / T``; without top-k/top-p the
    log of those probabilities over token ids (``sampling_from_probs_torch``); with them the
    float64 log of the sorted, truncated probabilities over ranks
    (``top_k_top_p_min_p_sampling_from_probs_torch``). A node's draw depends only on its
    prefix's logits, the seed and its position, so the committed tokens are the ones
    non-speculative seeded decoding produces (up to last-bit differences in the logits), and
    each is an exact sample, as with ``per_node_targets``. Min-p with a seed is refused by
    SGLang's own sampler; the worker does not come here for it.
    """
    rows, vocab = logits.shape
    bs = rows // width

    def per_row(t: torch.Tensor) -> torch.Tensor:
        return node_rows(t, bs, width, logits.device)

    temp = per_row(temperatures).float().view(rows, 1)
    probs = torch.softmax(logits.float() / temp, dim=-1)
    seed_rows = per_row(seeds)
    pos = positions.reshape(rows).to(logits.device)
    if top_ks is None and top_ps is None:
        return seeded(torch.log(probs), seed_rows, pos).view(bs, width)
    probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
    cum = torch.cumsum(probs_sort, dim=-1)
    if top_ks is not None:
        ranks = torch.arange(vocab, device=logits.device).view(1, -1)
        probs_sort[ranks >= per_row(top_ks).view(rows, 1)] = 0.0
    if top_ps is not None:
        probs_sort[(cum - probs_sort) > per_row(top_ps).view(rows, 1)] = 0.0
    rank = seeded(probs_sort.to(torch.float64).log(), seed_rows, pos)
    return torch.gather(probs_idx, 1, rank.view(rows, 1)).view(bs, width)


def draw_rows(
    probs: torch.Tensor, logits: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One draw per row of ``probs`` ``[R, V]``, with no host sync and no failure mode.

    ``argmax(p / E)`` with ``E ~ Exp(1)`` is an exact categorical sample (the trick
    ``torch.multinomial`` uses for one sample), minus multinomial's validity checks, which
    (depending on the torch build) sync with the host, or raise or assert on the device on a
    NaN/inf/all-zero row and take the scheduler down. A row that is
    not a distribution (non-finite, negative or zero mass) takes the argmax of its finite
    ``logits`` instead, so a degenerate row yields a defined token, never an error or a hang.
    """
    p = probs.float()
    ok = torch.isfinite(p).all(-1) & (p >= 0).all(-1) & (p.sum(-1) > 0)
    p = torch.where(ok.unsqueeze(1), p, torch.zeros_like(p)).nan_to_num(0.0)
    noise = torch.empty_like(p).exponential_(1.0, generator=generator)
    noise.clamp_(min=torch.finfo(torch.float32).tiny)  # 0/0 would be a NaN argmax
    sampled = (p / noise).argmax(-1)
    finite = torch.nan_to_num(logits.float(), nan=float("-inf"))
    return torch.where(ok, sampled, finite.argmax(-1)).view(-1, 1)


def use_fused_renorm(sampling_backend: str | None, on_cuda: bool) -> bool:
    """Whether the T > 0 path may use sgl_kernel's (FlashInfer's) top-k/top-p renorm kernels.

    FlashInfer JIT-compiles its sampling module on first use. Under ``--sampling-backend
    pytorch`` nothing else in SGLang loads it, so the first T > 0 DDTree round compiled it
    inside the scheduler thread (no log line, a minute or more on a cold cache: the
    call-14 "hang").
    Honour the operator's choice: pytorch means the torch filtering here.
    """
    return bool(on_cuda) and (sampling_backend or "flashinfer") != "pytorch"


def warm_up_renorm(renorm: tuple[Callable, Callable], device) -> None:
    """Call both renorm kernels once on a tiny batch so that any JIT build runs at start-up."""
    probs = torch.softmax(torch.arange(8.0, device=device).repeat(2, 1), dim=-1)
    top_k_renorm, top_p_renorm = renorm
    top_k_renorm(probs, torch.full((2,), 4, dtype=torch.int32, device=device))
    top_p_renorm(probs, torch.full((2,), 0.9, dtype=torch.float32, device=device))
