"""Row logsumexp of half-precision logits with float32 accumulation, in one Triton launch.

The draft head's top-K log-probs need each row's full-vocabulary logsumexp. In torch that is
``logits.float()`` (a float32 copy of ``[bs*L, V]``: 290 MB at bs 32 on a 152k vocabulary,
0.4 ms of copy on the H200, docs/gpu-results.md §20) and a reduction over the copy; the top-K
then also runs on the copy. Here the logsumexp reads the bf16/fp16 rows once (online max and
rescaled sum, in float32), and the top-K runs on the half-precision logits, whose values are
exactly the copy's. Equal to ``torch.logsumexp(logits.float())`` up to float32 summation order
(tests/ddtree/test_topk_triton.py, Triton interpreter). One program per row, so
``topk.topk_logprobs`` uses it only from ``topk.FUSED_LSE_MIN_ROWS`` rows on (fewer leave most
SMs idle, and small batches are not bandwidth-bound).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit(do_not_specialize=["stride"])
def _row_lse_kernel(x_ptr, out_ptr, stride, V: tl.constexpr, BLOCK: tl.constexpr):
    # the vocabulary is compile-time (one compile per server: it never changes), which also
    # gives the loop a compile-time bound (the Triton interpreter needs one)
    r = tl.program_id(0).to(tl.int64)
    neg_inf = float("-inf")
    m = tl.full([BLOCK], neg_inf, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for i in range(0, (V + BLOCK - 1) // BLOCK):
        offs = i * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + r * stride + offs, mask=offs < V, other=neg_inf).to(tl.float32)
        m_new = tl.maximum(m, x)
        alive = m_new > neg_inf  # exp(-inf - -inf) would be NaN
        s = tl.where(alive, s * tl.exp(m - m_new) + tl.exp(x - m_new), 0.0)
        m = m_new
    big = tl.max(m, 0)
    total = tl.sum(tl.where(m > neg_inf, s * tl.exp(m - big), 0.0), 0)
    tl.store(out_ptr + r, tl.where(big > neg_inf, big + tl.log(total), neg_inf))


def row_logsumexp(logits: torch.Tensor) -> torch.Tensor:
    """float32 ``[rows, 1]`` logsumexp of each row of a 2-D half/float tensor (last dim
    contiguous)."""
    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    out = torch.empty((rows, 1), dtype=torch.float32, device=logits.device)
    if rows:
        _row_lse_kernel[(rows,)](logits, out, logits.stride(0), V=vocab, BLOCK=BLOCK)
    return out
