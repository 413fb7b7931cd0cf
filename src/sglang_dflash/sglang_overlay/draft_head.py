"""DDTree's draft head: per-position top-K log-probs over the target LM head, TP-aware.

Replaces DFlash's greedy argmax head. Under tensor parallelism each rank scores its vocabulary
shard, keeps its top-K with GLOBAL ids plus its shard logsumexp, and the ranks all-gather only
those (O(rows*K*tp) instead of full-vocab logits), then merge. ``DraftTopKHead`` writes into
static buffers so it can be folded into the draft CUDA graph as a capture tail hook, the way
SGLang folds ``_DflashDraftSampler``.
"""

from __future__ import annotations

import torch

from sglang_dflash.ddtree.topk import (
    FUSED_LSE_MIN_ROWS,
    merge_tp_topk,
    shard_topk,
    topk_logprobs,
)


def draft_topk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    k: int,
    *,
    num_org: int | None = None,
    vocab_start: int = 0,
    tp_group=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` log-probs and global ids for draft hidden rows ``[rows, F]`` (eager path)."""
    w = weight if num_org is None else weight[:num_org]
    hs = hidden if hidden.dtype == w.dtype else hidden.to(w.dtype)
    logits = torch.matmul(hs, w.T)
    tp = 1 if tp_group is None else int(tp_group.world_size)
    if tp == 1:
        logp, ids = topk_logprobs(logits, k)
        return logp, ids + vocab_start
    vals, ids, lse = shard_topk(logits, k, vocab_start)
    rows = vals.shape[0]
    g_vals = torch.empty((tp * rows, k), dtype=vals.dtype, device=vals.device)
    g_ids = torch.empty((tp * rows, k), dtype=ids.dtype, device=ids.device)
    g_lse = torch.empty((tp * rows,), dtype=lse.dtype, device=lse.device)
    tp_group.all_gather_into_tensor(g_vals, vals.contiguous())
    tp_group.all_gather_into_tensor(g_ids, ids.contiguous())
    tp_group.all_gather_into_tensor(g_lse, lse.contiguous())
    return merge_tp_topk(g_vals.view(tp, rows, k), g_ids.view(tp, rows, k), g_lse.view(tp, rows), k)


class DraftTopKHead:
    """Capture-safe top-K head: reads the draft block's hidden states, writes static buffers.

    Block position 0 holds the bonus token, so rows 1..B-1 of each block are the L = B-1 draft
    depths. After a graph replay the worker reads ``logp[:bs*L]`` / ``ids[:bs*L]``.
    """

    def __init__(
        self,
        *,
        weight: torch.Tensor,
        block_size: int,
        k: int,
        num_org: int,
        vocab_start: int,
        max_bs: int,
        tp_group=None,
    ):
        self.weight = weight
        self.block_size = int(block_size)
        self.k = int(k)
        self.num_org = int(num_org)
        self.vocab_start = int(vocab_start)
        self.tp_group = tp_group
        rows = int(max_bs) * (self.block_size - 1)
        dev = weight.device
        self.logp = torch.empty((rows, self.k), dtype=torch.float32, device=dev)
        self.ids = torch.empty((rows, self.k), dtype=torch.int64, device=dev)
        if tp_group is None and dev.type == "cuda":
            # compile the fused logsumexp (topk.topk_logprobs, batches of >= 64 rows) now,
            # eagerly: its first launch must not fall inside a CUDA-graph capture
            topk_logprobs(torch.zeros((FUSED_LSE_MIN_ROWS, self.num_org), dtype=weight.dtype,
                                      device=dev), min(self.k, self.num_org))

    def __call__(self, hidden_states: torch.Tensor, input_ids=None) -> None:
        del input_ids
        bs = hidden_states.shape[0] // self.block_size
        hs = hidden_states.view(bs, self.block_size, -1)[:, 1:, :].reshape(
            -1, hidden_states.shape[-1]
        )
        logp, ids = draft_topk(
            hs,
            self.weight,
            self.k,
            num_org=self.num_org,
            vocab_start=self.vocab_start,
            tp_group=self.tp_group,
        )
        n = hs.shape[0]
        self.logp[:n].copy_(logp)
        self.ids[:n].copy_(ids)

    def read(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[bs, L, K]`` views of the last replay's output (clone before editing)."""
        depth = self.block_size - 1
        n = bs * depth
        return self.logp[:n].view(bs, depth, self.k), self.ids[:n].view(bs, depth, self.k)
