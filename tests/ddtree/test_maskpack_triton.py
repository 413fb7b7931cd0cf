"""The sync-free custom-mask pack equals FlashInfer's ``segment_packbits`` semantics.

``maskpack_triton.pack_triton`` against ``pack_reference`` (per block: pad to a byte, little
bit order, blocks back to back) on FULL_MASK-shaped masks of real DDTree trees (the verify's
``qo_len x kv_len`` blocks, ``ddtree.mask.full_mask``) and on random blocks of every length
mod 8; the bit offsets come from the page layout as FlashInfer computes them. Under the Triton
interpreter without a GPU; a subprocess lowers the kernel for sm_90.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the DDTree core needs torch")
from .triton_env import DEV, import_triton_module, lower_for_sm90  # noqa: E402

mp = import_triton_module("sglang_dflash.ddtree.maskpack_triton")
pytestmark = pytest.mark.usefixtures("triton_interpret")


def _pack(mask, bit_indptr, max_bits, fill=0xA5):
    out = torch.full((mask.numel() // 8 + 8 * bit_indptr.numel() + 64,), fill, dtype=torch.uint8,
                     device=DEV)
    out_indptr = torch.full((bit_indptr.numel(),), -7, dtype=torch.int32, device=DEV)
    mp.pack_triton(mask.to(DEV), bit_indptr.to(DEV), out, out_indptr, max_bits)
    return out, out_indptr


@pytest.mark.parametrize("seed", range(4))
def test_random_blocks_of_every_length(seed):
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor([0, 1, 7, 8, 9, 15, 16, 17, 1000, 2048 + 3])
    lens = lens[torch.randperm(10, generator=g)]
    bit_indptr = torch.zeros(lens.numel() + 1, dtype=torch.int64)
    bit_indptr[1:] = torch.cumsum(lens, 0)
    mask = torch.rand(int(bit_indptr[-1]) + 13, generator=g) < 0.5  # a tail past the last block
    ref, ref_indptr = mp.pack_reference(mask, bit_indptr)
    out, out_indptr = _pack(mask, bit_indptr, int(lens.max()))
    assert out_indptr.cpu().tolist() == ref_indptr.tolist()
    n = int(ref_indptr[-1])
    assert torch.equal(out[:n].cpu(), ref)
    assert (out[n:].cpu() == 0xA5).all()  # nothing written past the packed mask


def test_a_grid_bound_above_the_largest_block_changes_nothing():
    lens = torch.tensor([40, 3, 17])
    bit_indptr = torch.tensor([0, 40, 43, 60])
    mask = torch.rand(60, generator=torch.Generator().manual_seed(9)) < 0.5
    a, ai = _pack(mask, bit_indptr, int(lens.max()))
    b, bi = _pack(mask, bit_indptr, 100_000)  # a loose host bound: extra programs exit
    assert torch.equal(a, b) and torch.equal(ai, bi)


def test_full_masks_of_real_trees_with_the_page_layout():
    """The verify's FULL_MASK for trees with prefixes 0..37 (page size 1: kv_len = pages),
    offsets from (qo_indptr, kv_indptr, last_page_len) as FlashInfer derives them."""
    from sglang_dflash.ddtree.mask import full_mask
    from sglang_dflash.ddtree.tree import build_tree

    g = torch.Generator().manual_seed(3)
    bs, depth, k, budget = 5, 6, 4, 9
    logp = torch.log_softmax(torch.randn(bs, depth, k, generator=g), -1)
    ids = torch.randint(0, 100, (bs, depth, k), generator=g)
    prefix = torch.tensor([0, 5, 37, 12, 1])
    tree = build_tree(logp, ids, torch.zeros(bs, dtype=torch.long), prefix, budget)
    width = budget + 1
    mask = full_mask(tree, prefix, seq_lens_sum=int(prefix.sum()))
    qo_indptr = torch.arange(bs + 1) * width
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int64)
    kv_indptr[1:] = torch.cumsum(prefix + width, 0)
    bits = mp.mask_bit_indptr(qo_indptr, kv_indptr, torch.ones(bs, dtype=torch.int32), 1)
    assert bits.tolist() == [0, *torch.cumsum(width * (prefix + width), 0).tolist()]
    ref, ref_indptr = mp.pack_reference(mask, bits)
    out, out_indptr = _pack(mask, bits, width * int((prefix + width).max()))
    assert out_indptr.cpu().tolist() == ref_indptr.tolist()
    assert torch.equal(out[:int(ref_indptr[-1])].cpu(), ref)


def test_pages_larger_than_one_token():
    """kv_len = (pages - 1) * page_size + last_page_len, as FlashInfer counts it."""
    bits = mp.mask_bit_indptr(torch.tensor([0, 2, 5]), torch.tensor([0, 3, 4]),
                              torch.tensor([2, 4]), 4)
    assert bits.tolist() == [0, 2 * (2 * 4 + 2), 2 * 10 + 3 * 4]


def test_the_fast_plan_packer_writes_what_flashinfer_reads():
    """``fast_plan.pack_custom_mask`` (what the masked fast plan runs) on a two-request mask:
    byte offsets into the wrapper's indptr buffer (int32), packed bits into its mask buffer."""
    from sglang_dflash.sglang_overlay import fast_plan

    mask = torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1], dtype=torch.bool, device=DEV)
    out = torch.zeros(8, dtype=torch.uint8, device=DEV)
    indptr = torch.zeros(3, dtype=torch.int32, device=DEV)
    fast_plan.pack_custom_mask(mask, torch.tensor([0, 1, 2], device=DEV),
                               torch.tensor([0, 9, 11], device=DEV),
                               torch.ones(2, dtype=torch.int32, device=DEV), 1, out, indptr, 9)
    assert indptr.cpu().tolist() == [0, 2, 3]
    assert out[:3].cpu().tolist() == [0b00001101, 0b1, 0b11]


def test_kernel_compiles_for_sm90():
    code = """
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from sglang_dflash.ddtree import maskpack_triton as mp
        sig = {"mask_ptr": "*u8", "bit_indptr_ptr": "*i64", "byte_indptr_ptr": "*i64",
               "out_ptr": "*u8", "BLOCK": "constexpr"}
        k = triton.compile(ASTSource(mp._pack_kernel, sig, constexprs={"BLOCK": 256}),
                           target=GPUTarget("cuda", 90, 32))
        assert k.asm["cubin"]
        print("ok")
    """
    lower_for_sm90(code)
