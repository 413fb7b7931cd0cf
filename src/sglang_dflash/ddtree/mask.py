"""Verify-time attention masks in SGLang's tree-mask layouts.

FULL_MASK (``eagle_utils.TreeMaskMode.FULL_MASK``): per request a row-major bool block
``[W, seq_len + W]`` (True = may attend), prefix columns all True, the ``W x W`` tail the
ancestor-or-self visibility; blocks concatenated over requests. The Triton backend's
``mask_indptr`` and ``DFlashVerifyInput.generate_attn_arg_prefill`` assume exactly this.
Padding rows of a tree see themselves, so no row is ever fully masked (no NaN softmax).

The padded layout (``padded_lens``): each request's block is ``[W, P + W]`` for a host-known
``P >= seq_len`` (the round's bound), the tree block still at columns ``seq_len .. seq_len + W``
and the ``P - seq_len`` columns after it False. A verify whose kv lengths are ``P + W`` on the
device as on the host attends over the KV slots ``req_to_token[0 : P + W]`` and the mask hides
the ones past the tree: FlashInfer's split-KV plan then reads the lengths the kernel uses
(docs/ddtree.md, "A padded verify").
"""

from __future__ import annotations

import torch

from .tree import DDTree, use_triton, verify_kernels


def full_mask_offsets(seq_lens: torch.Tensor, width: int) -> torch.Tensor:
    """Start of each request's block in the flat FULL_MASK (``[bs]`` int64, device side)."""
    s = seq_lens.long()
    return width * (torch.cumsum(s, 0) - s) + torch.arange(s.shape[0], device=s.device) * (
        width * width
    )


def padded_full_mask(tree: DDTree, seq_lens: torch.Tensor, padded_lens: torch.Tensor,
                     padded_sum: int, pad_max: int, tail: int = 0) -> torch.Tensor:
    """The padded FULL_MASK (module docstring): blocks ``[W, P + W]`` with ``P`` =
    ``padded_lens`` (``[bs]``, >= ``seq_lens`` on the device; ``padded_sum`` its host sum,
    ``pad_max`` a host bound of the longest ``P - seq_lens``: the columns a row clears;
    ``tail`` True elements after the blocks, the room SGLang's verify would otherwise add with
    a copy of the whole mask).
    One Triton launch after the fill on CUDA; the torch version (CPU, or a batch over the
    kernel's limit) builds each block densely to the longest and keeps the valid columns,
    which reads the layout back to the host (a sync)."""
    bs, width = tree.tokens.shape
    dev = tree.tokens.device
    if width > 1 and use_triton(tree.visibility):
        kernels = verify_kernels()
        if kernels is not None and bs <= kernels.MASK_MAX_BS:
            return kernels.full_mask_triton(tree.visibility, seq_lens, int(padded_sum),
                                            padded_lens=padded_lens, pad_max=pad_max,
                                            tail=tail)
    s = seq_lens.to(device=dev, dtype=torch.long).view(bs, 1, 1)
    p = padded_lens.to(device=dev, dtype=torch.long).view(bs, 1, 1)
    longest = int(p.max()) + width if bs else width
    c = torch.arange(longest, device=dev).view(1, 1, longest)
    rel = (c - s).clamp(min=0, max=width - 1)
    vis = tree.visibility.to(torch.bool).gather(2, rel.expand(bs, width, longest))
    dense = (c < s) | ((c >= s) & (c < s + width) & vis)
    out = dense[(c < p + width).expand(bs, width, longest)]
    if out.numel() != int(padded_sum) * width + bs * width * width:
        raise ValueError(f"padded_sum {padded_sum} is not the sum of padded_lens")
    return torch.cat([out, torch.ones(max(int(tail), 0), dtype=torch.bool, device=dev)])


def full_mask(
    tree: DDTree,
    seq_lens: torch.Tensor,
    *,
    seq_lens_sum: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Flat bool FULL_MASK for ``tree`` over prefixes of ``seq_lens``.

    The total size depends on the sequence lengths, so pass the host-side ``seq_lens_sum``
    (SGLang's ``batch.seq_lens_sum``; an upper bound is fine, the tail stays True) or a
    preallocated ``out`` buffer (set True, then the tree blocks written; with ``seq_lens_sum``
    only the used prefix of ``out`` is refreshed). Without either, the sum is read back from the
    device: a host sync.
    """
    bs, width = tree.tokens.shape
    dev = tree.tokens.device
    if out is None and seq_lens_sum is not None and width > 1 and use_triton(tree.visibility):
        kernels = verify_kernels()
        if kernels is not None and bs <= kernels.MASK_MAX_BS:  # 2 launches instead of 14
            return kernels.full_mask_triton(tree.visibility, seq_lens, int(seq_lens_sum))
    s = seq_lens.to(device=dev, dtype=torch.long)
    if out is None:
        total_prefix = int(s.sum()) if seq_lens_sum is None else int(seq_lens_sum)
        out = torch.ones(total_prefix * width + bs * width * width, dtype=torch.bool, device=dev)
    elif seq_lens_sum is not None:  # refresh only the part this batch uses
        out[: int(seq_lens_sum) * width + bs * width * width].fill_(True)
    else:
        out.fill_(True)
    if width == 1:  # a root-only tree: the root sees its prefix and itself, all True
        return out
    base = full_mask_offsets(s, width)  # [bs]
    i = torch.arange(width, device=dev)
    row_start = base.view(bs, 1) + i.view(1, width) * (s.view(bs, 1) + width)  # [bs, W]
    idx = row_start.unsqueeze(2) + s.view(bs, 1, 1) + i.view(1, 1, width)  # [bs, W, W]
    out[idx.reshape(-1)] = tree.visibility.reshape(-1)
    return out


def qlen_mask(tree: DDTree) -> torch.Tensor:
    """QLEN_ONLY layout: just the ``W x W`` visibility blocks, flat ``[bs*W*W]`` bool."""
    return tree.visibility.reshape(-1).contiguous()
