"""Top-K log-prob head for the drafter, single device and tensor-parallel.

DDTree compares prefix scores across depths, so every value must be a true log-probability
(normalised by the full-vocabulary logsumexp), not a raw logit. Under TP each rank only sees a
vocabulary shard: it sends its local top-K with GLOBAL ids plus its local logsumexp, which is
O(rows*K) communication instead of an all-gather of full-vocab logits.
"""

from __future__ import annotations

import torch

from sglang_dflash.ddtree.tree import triton_module, use_triton

# rows from which the fused logsumexp is used (one Triton program per row: fewer rows leave
# most SMs idle, and a small batch is not bandwidth-bound)
FUSED_LSE_MIN_ROWS = 64


def _fused_lse(logits: torch.Tensor) -> bool:
    return logits.dim() == 2 and logits.shape[0] >= FUSED_LSE_MIN_ROWS and use_triton(logits)


def topk_logprobs(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` log-softmax values (float32, sorted descending) and their int64 ids.

    Half-precision CUDA logits of at least ``FUSED_LSE_MIN_ROWS`` rows skip the
    float32 copy: the logsumexp is one Triton pass with float32 accumulation and the top-K
    runs on the logits themselves (their values are exactly the copy's).
    """
    if logits.dtype in (torch.bfloat16, torch.float16) and _fused_lse(logits):
        kernel = triton_module("sglang_dflash.ddtree.topk_triton")
        if kernel is not None:
            vals, ids = torch.topk(logits, k, dim=-1, largest=True, sorted=True)
            return vals.float() - kernel.row_logsumexp(logits), ids.long()
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    vals, ids = torch.topk(x, k, dim=-1, largest=True, sorted=True)
    return vals - lse, ids.long()


def shard_topk(
    logits_shard: torch.Tensor, k: int, vocab_start: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One TP rank's contribution: raw top-``k`` values, global ids, and the shard logsumexp.

    A shard narrower than ``k`` is padded with ``-inf`` values (id -1) so every rank sends the
    same shape; the merge never selects them while the whole vocabulary has >= k entries.
    """
    x = logits_shard.float()
    rows, width = x.shape
    lse = torch.logsumexp(x, dim=-1)
    kk = min(k, width)
    vals, ids = torch.topk(x, kk, dim=-1, largest=True, sorted=True)
    ids = ids.long() + vocab_start
    if kk < k:
        pad_v = torch.full((rows, k - kk), float("-inf"), dtype=vals.dtype, device=x.device)
        pad_i = torch.full((rows, k - kk), -1, dtype=ids.dtype, device=x.device)
        vals = torch.cat([vals, pad_v], dim=1)
        ids = torch.cat([ids, pad_i], dim=1)
    return vals, ids, lse


def merge_tp_topk(
    vals: torch.Tensor, ids: torch.Tensor, lse: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge all-gathered shard results ``[tp, rows, k]`` into global top-``k`` log-probs."""
    tp, rows, kk = vals.shape
    global_lse = torch.logsumexp(lse.float(), dim=0)  # [rows]
    cat_v = vals.float().permute(1, 0, 2).reshape(rows, tp * kk)
    cat_i = ids.long().permute(1, 0, 2).reshape(rows, tp * kk)
    top_v, pos = torch.topk(cat_v, k, dim=-1, largest=True, sorted=True)
    return top_v - global_lse.unsqueeze(-1), torch.gather(cat_i, 1, pos)
