"""The one-launch KV compaction equals SGLang's move_accept_tokens path, buffer for buffer.

``kv_compact_triton.compact_triton`` against ``compact_reference`` (SGLang's packed-list
algorithm in torch) on random trees' accepted paths, with KV buffers addressed the way
``MHATokenToKVPool`` hands them to its tiled copy (raw base pointers + bytes per slot). Without
a GPU under the Triton interpreter; a subprocess lowers the kernel for sm_90.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the DDTree core needs torch")
from .triton_env import DEV, import_triton_module, lower_for_sm90  # noqa: E402

kc = import_triton_module("sglang_dflash.ddtree.kv_compact_triton")
pytestmark = pytest.mark.usefixtures("triton_interpret")


def _case(seed, bs, width, d1, slots_per_row=64, shapes=((5, 4), (5, 4)), chain=False):
    """KV buffers, the verify's slots, req_to_token and an accepted path per request."""
    g = torch.Generator().manual_seed(seed)
    slots_per_row = max(slots_per_row, width + 16)
    n_slots = 1 + bs * slots_per_row
    buffers = [torch.randn((n_slots, *s), generator=g).to(torch.float16) for s in shapes]
    buffers += [torch.randn((n_slots, *s), generator=g).to(torch.float16) for s in shapes]
    perm = torch.randperm(n_slots - 1, generator=g) + 1  # slot 0 is the pool's padding slot
    rows = 2 * bs + 1
    req_to_token = torch.zeros((rows, slots_per_row), dtype=torch.int32)
    pool = torch.randperm(rows, generator=g)[:bs]
    prefix = torch.randint(0, slots_per_row - width, (bs,), generator=g)
    out_cache_loc = torch.zeros(bs * width, dtype=torch.long)
    idx = torch.full((bs, d1), -1, dtype=torch.int32)
    n_acc = torch.zeros(bs, dtype=torch.int32)
    for b in range(bs):
        req_to_token[pool[b]] = perm[b * slots_per_row:(b + 1) * slots_per_row].to(torch.int32)
        out_cache_loc[b * width:(b + 1) * width] = req_to_token[
            pool[b], prefix[b]:prefix[b] + width].long()
        n = int(torch.randint(0, min(d1, width), (1,), generator=g))
        if chain:
            local = list(range(n + 1))  # the first nodes: nothing to move
        else:
            local = [0, *sorted(torch.randperm(width - 1, generator=g)[:n].add(1).tolist())]
        idx[b, :n + 1] = torch.tensor(local, dtype=torch.int32) + b * width
        n_acc[b] = n
    return buffers, out_cache_loc, req_to_token, pool, prefix, idx, n_acc


def _pool_view(buffers):
    """What MHATokenToKVPool passes its tiled copy: base pointers, bytes per slot, tiling."""
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in buffers], dtype=torch.long)
    cfg = {"bytes_per_tile": 16, "byte_tiles": (int(strides.max()) + 15) // 16, "num_warps": 4}
    return ptrs, strides, cfg


@pytest.mark.parametrize(("seed", "bs", "width", "d1"),
                         [(0, 1, 4, 4), (1, 3, 16, 16), (2, 5, 17, 16), (3, 4, 9, 16),
                          (4, 2, 65, 16), (5, 6, 2, 2)])
def test_compaction_equals_sglang_path(seed, bs, width, d1):
    """Slot size 40 bytes with 16-byte tiles: the last tile is partial."""
    case = _case(seed, bs, width, d1)
    before = [b.clone() for b in case[0]]
    ref = [b.clone() for b in case[0]]
    kc.compact_reference(ref, *case[1:])
    got = [b.clone().to(DEV) for b in case[0]]
    ptrs, strides, cfg = _pool_view(got)
    out_cache_loc, r2t, pool, prefix, idx, n_acc = (t.to(DEV) for t in case[1:])
    kc.compact_triton(ptrs.to(DEV), strides.to(DEV), cfg, out_cache_loc, r2t, pool, prefix,
                      idx, n_acc, width)
    moved = any(not torch.equal(a, b) for a, b in zip(ref, before, strict=True))
    local = case[5].long() - torch.arange(bs).view(-1, 1) * width
    off_slot = (case[5] >= 0) & (local != torch.arange(d1).view(1, -1))
    assert moved == bool(off_slot.any())  # the reference moved exactly when a node was off
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a.cpu(), b)


def test_chain_along_the_first_nodes_copies_nothing():
    """Accepted nodes 0..n sit in their slots already; the reference copies them onto
    themselves, the kernel not at all: poisoning a source row shows which rows were read."""
    buffers, out_cache_loc, r2t, pool, prefix, idx, n_acc = _case(7, 3, 16, 16, chain=True)
    before = [b.clone() for b in buffers]
    ptrs, strides, cfg = _pool_view(buffers)
    kc.compact_triton(ptrs, strides, cfg, out_cache_loc, r2t, pool, prefix, idx, n_acc, 16)
    assert all(torch.equal(a, b) for a, b in zip(buffers, before, strict=True))
    ref = [b.clone() for b in before]
    kc.compact_reference(ref, out_cache_loc, r2t, pool, prefix, idx, n_acc)
    assert all(torch.equal(a, b) for a, b in zip(ref, before, strict=True))


def test_empty_batch_is_a_no_op():
    ptrs = torch.zeros(2, dtype=torch.uint64)
    kc.compact_triton(ptrs, torch.ones(2, dtype=torch.long), {"bytes_per_tile": 16,
                      "byte_tiles": 1}, torch.zeros(0, dtype=torch.long),
                      torch.zeros((1, 4), dtype=torch.int32), torch.zeros(0, dtype=torch.long),
                      torch.zeros(0, dtype=torch.long), torch.zeros((0, 4), dtype=torch.int32),
                      torch.zeros(0, dtype=torch.int32), 4)


def test_kernel_compiles_for_sm90():
    """Lowered to a Hopper cubin without a GPU; runtime sizes unspecialised."""
    code = """
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from sglang_dflash.ddtree import kv_compact_triton as kc
        sig = {"data_ptrs": "*u64", "strides": "*i64", "out_cache_loc_ptr": "*i64",
               "req_to_token_ptr": "*i32", "pool_idx_ptr": "*i64", "prefix_ptr": "*i64",
               "idx_ptr": "*i32", "len_ptr": "*i32", "W": "i32", "D1": "i32",
               "row_stride": "i32", "DP": "constexpr", "BYTES_PER_TILE": "constexpr"}
        k = triton.compile(ASTSource(kc._compact_kernel, sig,
                                     constexprs={"DP": 16, "BYTES_PER_TILE": 128}),
                           target=GPUTarget("cuda", 90, 32))
        assert k.asm["cubin"]
        assert {p.name for p in kc._compact_kernel.params if p.do_not_specialize} == {
            "W", "D1", "row_stride"}
        print("ok")
    """
    lower_for_sm90(code)
