"""Verify-time attention masks in SGLang's tree-mask layouts.

FULL_MASK (``eagle_utils.TreeMaskMode.FULL_MASK``): per request a row-major bool block
``[W, seq_len + W]`` (True = may attend), prefix columns all True, the ``W x W`` tail the
ancestor-or-self visibility; blocks concatenated over requests. The Triton backend's
``mask_indptr`` and ``DFlashVerifyInput.generate_attn_arg_prefill`` assume exactly this.
Padding rows of a tree see themselves, so no row is ever fully masked (no NaN softmax).
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
