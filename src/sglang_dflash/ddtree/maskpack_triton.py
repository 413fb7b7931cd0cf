"""The verify's custom mask packed into FlashInfer's CUDA-graph buffers without a host sync.

FlashInfer's ``plan`` packs a bool custom mask with ``segment_packbits``: each request's
``qo_len x kv_len`` block (row-major, the FULL_MASK layout ``ddtree.mask.full_mask`` writes)
becomes ``ceil(bits / 8)`` bytes, little bit order, the blocks back to back; the byte offsets
replace ``mask_indptr``. Its output size is read back to the host (a sync), and the plan then
copies the packed mask into the wrapper's ``custom_mask_buf``. Here one launch writes the packed
bytes straight into that buffer and the byte offsets into ``mask_indptr_buf``, both from device
tensors; only the grid is sized from host bounds (the largest block's bits), so extra programs
exit. ``pack_reference`` is ``segment_packbits``'s semantics in torch; the tests compare the two
under the Triton interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_BYTES = 256


def mask_bit_indptr(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                    last_page_len: torch.Tensor, page_size: int) -> torch.Tensor:
    """Each request's block offset in bits, ``[bs+1]`` int64 on the device: FlashInfer's
    ``_compute_page_mask_indptr`` (qo_len x kv_len, kv_len from pages and the last page)."""
    qo = (qo_indptr[1:] - qo_indptr[:-1]).long()
    kv = (kv_indptr[1:] - kv_indptr[:-1] - 1).long() * page_size + last_page_len.long()
    out = torch.zeros(qo.shape[0] + 1, dtype=torch.int64, device=qo.device)
    torch.cumsum(qo * kv, 0, out=out[1:])
    return out


@triton.jit
def _pack_kernel(mask_ptr, bit_indptr_ptr, byte_indptr_ptr, out_ptr,
                 BLOCK: tl.constexpr):
    r = tl.program_id(0)
    blk = tl.program_id(1)
    start = tl.load(bit_indptr_ptr + r)
    seg = tl.load(bit_indptr_ptr + r + 1) - start
    n_bytes = (seg + 7) // 8
    dst = tl.load(byte_indptr_ptr + r)
    b = blk * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    live = b < n_bytes
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for k in tl.static_range(8):
        idx = b * 8 + k
        bit = tl.load(mask_ptr + start + idx, mask=live & (idx < seg), other=0)
        acc = acc | (bit.to(tl.int32) << k)
    tl.store(out_ptr + dst + b, acc.to(tl.uint8), mask=live)


def pack_triton(mask: torch.Tensor, bit_indptr: torch.Tensor, out: torch.Tensor,
                out_indptr: torch.Tensor, max_block_bits: int) -> None:
    """Pack ``mask`` (flat bool) by the blocks of ``bit_indptr`` into ``out`` (uint8) and their
    byte offsets into ``out_indptr`` (``[bs+1]``, its dtype kept). ``max_block_bits`` is a host
    upper bound of the largest block (it sizes the grid)."""
    seg = bit_indptr[1:] - bit_indptr[:-1]
    byte_indptr = torch.zeros_like(bit_indptr)
    torch.cumsum((seg + 7) // 8, 0, out=byte_indptr[1:])
    out_indptr[: byte_indptr.numel()].copy_(byte_indptr)  # FlashInfer's buffer: bs+1 long
    bs = seg.shape[0]
    n_blocks = max(1, triton.cdiv(triton.cdiv(int(max_block_bits), 8), BLOCK_BYTES))
    if bs:
        _pack_kernel[(bs, n_blocks)](mask.view(torch.uint8), bit_indptr, byte_indptr, out,
                                     BLOCK=BLOCK_BYTES)


def pack_reference(mask: torch.Tensor, bit_indptr: torch.Tensor) -> tuple[torch.Tensor,
                                                                          torch.Tensor]:
    """``segment_packbits(mask, bit_indptr, bitorder="little")``: (packed bytes, byte
    offsets)."""
    chunks, offsets = [], [0]
    for r in range(bit_indptr.numel() - 1):
        bits = mask[int(bit_indptr[r]):int(bit_indptr[r + 1])].to(torch.int32)
        pad = (-bits.numel()) % 8
        bits = torch.cat([bits, torch.zeros(pad, dtype=torch.int32, device=bits.device)])
        weights = 2 ** torch.arange(8, dtype=torch.int32, device=bits.device)
        chunks.append((bits.view(-1, 8) * weights).sum(1).to(torch.uint8))
        offsets.append(offsets[-1] + chunks[-1].numel())
    packed = torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.uint8)
    return packed, torch.tensor(offsets, dtype=torch.int64)
