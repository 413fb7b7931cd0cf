"""The fused verify kernels equal the torch code they replace, element for element.

``full_mask_triton`` against ``mask.full_mask`` on real trees (the torch builder's), and
``accept_tail_triton`` against ``verify.greedy_accept``'s tail after the walk kernel plus
``adaptive.path_counts``. Without a GPU the kernels run under the Triton interpreter
(TRITON_INTERPRET=1, CPU tensors), as tests/ddtree/test_tree_triton.py does; a subprocess also
compiles them for sm_90 so lowering errors the interpreter cannot see are caught.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the DDTree core needs torch")
from sglang_dflash.ddtree.mask import full_mask  # noqa: E402
from sglang_dflash.ddtree.tree import build_tree_torch  # noqa: E402
from sglang_dflash.sglang_overlay.adaptive import path_counts  # noqa: E402
from sglang_dflash.sglang_overlay.verify import greedy_accept  # noqa: E402

from .test_tree import make_inputs  # noqa: E402
from .test_walk import path_biased_predictions  # noqa: E402
from .triton_env import (  # noqa: E402
    DEV,
    import_triton_module,
    lower_for_sm90,
)

vt = import_triton_module("sglang_dflash.ddtree.verify_triton")
pytestmark = pytest.mark.usefixtures("triton_interpret")


def _tree(seed, bs, depth, k, budget):
    logp, ids, roots, seq_lens = make_inputs(seed, bs, depth, k, ["smooth", "ties"][seed % 2])
    seq_lens = seq_lens + torch.randint(0, 40, (bs,), generator=torch.Generator().manual_seed(
        seed))  # uneven prefixes: the offsets of later requests depend on earlier ones
    return build_tree_torch(logp, ids, roots, seq_lens, budget), seq_lens


@pytest.mark.parametrize(("seed", "bs", "depth", "k", "budget"),
                         [(0, 1, 3, 4, 5), (1, 3, 5, 6, 16), (2, 5, 15, 8, 64), (3, 2, 4, 3, 1)])
@pytest.mark.parametrize("slack", [0, 37])
def test_full_mask_equals_torch(seed, bs, depth, k, budget, slack):
    """Also with a host bound above the true prefix sum (overlap scheduling's upper bound):
    the tail stays True in both."""
    tree, seq_lens = _tree(seed, bs, depth, k, budget)
    host_sum = int(seq_lens.sum()) + slack
    ref = full_mask(tree, seq_lens, seq_lens_sum=host_sum)
    got = vt.full_mask_triton(tree.visibility.to(DEV), seq_lens.to(DEV), host_sum)
    assert got.dtype == torch.bool and got.shape == ref.shape
    assert torch.equal(got.cpu(), ref)


def _walked(seed, bs, depth, k, budget):
    """A tree, the target's per-node choice biased to follow it, and what SGLang's
    ``verify_tree_greedy`` hands back (int32 predicts / accept_index / accept_len), taken
    from the torch walk."""
    tree, _ = _tree(seed, bs, depth, k, budget)
    pred = path_biased_predictions(tree, torch.Generator().manual_seed(seed), p_follow=0.8)
    ref = greedy_accept(tree, pred)  # the torch walk
    width = tree.tokens.shape[1]
    predicts = torch.zeros(bs * width, dtype=torch.int32)
    flat = pred.reshape(-1).to(torch.int32)
    on_path = ref.accept_index.reshape(-1)
    on_path = on_path[on_path >= 0]
    predicts[on_path] = flat[on_path]  # the kernel writes predicts only along the path
    return tree, pred, predicts, ref.accept_index.to(torch.int32), ref.accept_len.to(torch.int32)


def _kernel_returning(predicts, accept_index, accept_len):
    def kernel(**kw):
        return predicts.clone(), accept_index.clone(), accept_len.clone()
    return kernel


@pytest.mark.parametrize(("seed", "bs", "depth", "k", "budget"),
                         [(0, 1, 3, 4, 5), (1, 4, 5, 6, 16), (2, 6, 15, 8, 64), (5, 3, 2, 2, 3)])
def test_accept_tail_equals_the_torch_tail_and_path_counts(seed, bs, depth, k, budget):
    tree, pred, predicts, acc_idx, acc_len = _walked(seed, bs, depth, k, budget)
    width = tree.tokens.shape[1]
    ref = greedy_accept(tree, pred, kernel=_kernel_returning(predicts, acc_idx, acc_len))
    cands = [n for n in (1, 3, 7, 15, 31, 64) if n <= budget]
    want_counts = path_counts(ref.accept_index, width, torch.tensor(cands))
    got = vt.accept_tail_triton(predicts.to(DEV), acc_idx.to(DEV), acc_len.to(DEV), width,
                                vt.pad_budgets(cands, DEV), len(cands))
    names = ("accept_index", "accept_len", "out_tokens", "commit_lens", "bonus")
    for name, g in zip(names, got[:5], strict=True):
        r = getattr(ref, name)
        assert g.dtype == r.dtype and g.shape == r.shape, name
        assert torch.equal(g.cpu(), r), name
    assert torch.equal(got[5].cpu(), want_counts)
    # without budgets: no counts, the same acceptance
    plain = vt.accept_tail_triton(predicts.to(DEV), acc_idx.to(DEV), acc_len.to(DEV), width)
    assert plain[5] is None and torch.equal(plain[2].cpu(), ref.out_tokens)


def test_warm_up_runs_every_variant():
    vt.warm_up(17, 15, DEV)
    vt.warm_up(2, 1, DEV)


def test_pad_budgets_refuses_too_many():
    with pytest.raises(ValueError, match="at most"):
        vt.pad_budgets(range(1, vt.MAX_COUNTED + 2), "cpu")


def test_kernels_compile_for_sm90():
    """Lower both kernels to PTX for Hopper without a GPU (triton's own compile API), so a
    lowering error the interpreter cannot see fails here, not in the first served round."""
    code = """
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from sglang_dflash.ddtree import verify_triton as vt
        target = GPUTarget("cuda", 90, 32)
        mask_sig = {"vis_ptr": "*i1", "seq_ptr": "*i64", "pad_ptr": "*i64", "out_ptr": "*i1",
                    "bs": "i32", "W": "i32", "WP": "constexpr", "PADDED": "constexpr"}
        k1 = triton.compile(ASTSource(vt._full_mask_kernel, mask_sig,
                                      constexprs={"WP": 32, "PADDED": False}), target=target)
        k1p = triton.compile(ASTSource(vt._full_mask_kernel, mask_sig,
                                       constexprs={"WP": 32, "PADDED": True}), target=target)
        assert k1p.asm["cubin"]
        tail_sig = {"pred_ptr": "*i32", "idx_ptr": "*i32", "len_ptr": "*i32",
                    "budgets_ptr": "*i64", "idx_out_ptr": "*i64", "len_out_ptr": "*i64",
                    "tok_out_ptr": "*i64", "commit_out_ptr": "*i32", "bonus_out_ptr": "*i64",
                    "counts_ptr": "*fp32", "W": "i32", "D1": "i32", "NB": "i32",
                    "DP": "constexpr", "NBP": "constexpr", "COUNT": "constexpr"}
        k2 = triton.compile(ASTSource(vt._accept_tail_kernel, tail_sig,
                                      constexprs={"DP": 16, "NBP": vt.MAX_COUNTED,
                                                  "COUNT": True}), target=target)
        assert k1.asm["cubin"] and k2.asm["cubin"]
        # Runtime sizes are not specialised (triton compiles a variant for ints == 1 or
        # divisible by 16 on first use: a stall mid-serving); the mask kernel's only
        # compile-time size is the width.
        assert {p.name for p in vt._full_mask_kernel.params if p.do_not_specialize} == {
            "bs", "W"}
        assert {p.name for p in vt._accept_tail_kernel.params if p.do_not_specialize} == {
            "W", "D1", "NB"}
        assert [p.name for p in vt._full_mask_kernel.params if p.is_constexpr] == [
            "WP", "PADDED"]
        print("ok")
    """
    lower_for_sm90(code)


def _padded_reference(tree, seq_lens, padded):
    """The padded FULL_MASK from the exact one: each row gets P - s False columns after it."""
    exact = full_mask(tree, seq_lens, seq_lens_sum=int(seq_lens.sum()))
    width, rows, at = tree.tokens.shape[1], [], 0
    for s, p in zip(seq_lens.tolist(), padded.tolist(), strict=True):
        block = exact[at: at + width * (s + width)].view(width, s + width)
        at += width * (s + width)
        rows.append(torch.cat([block, torch.zeros(width, p - s, dtype=torch.bool)], 1).reshape(-1))
    return torch.cat(rows)


@pytest.mark.parametrize(("seed", "bs", "depth", "k", "budget"),
                         [(0, 1, 3, 4, 5), (1, 3, 5, 6, 16), (2, 5, 15, 8, 64), (3, 2, 4, 3, 1)])
@pytest.mark.parametrize("pad", ["none", "small", "past_a_chunk"])
def test_padded_full_mask_torch_and_triton(seed, bs, depth, k, budget, pad):
    """The padded layout (a verify planned from the bound on FlashInfer): each block [W, P+W],
    the tree at the request's own prefix, False after it; P = s gives the exact layout."""
    from sglang_dflash.ddtree.mask import padded_full_mask

    tree, seq_lens = _tree(seed, bs, depth, k, budget)
    gen = torch.Generator().manual_seed(100 + seed)
    extra = {"none": torch.zeros(bs, dtype=torch.long),
             "small": torch.randint(0, 9, (bs,), generator=gen),
             "past_a_chunk": torch.randint(60, 140, (bs,), generator=gen)}[pad]
    padded = seq_lens + extra
    ref = _padded_reference(tree, seq_lens, padded)
    pad_max = int(extra.max())
    got_torch = padded_full_mask(tree, seq_lens, padded, int(padded.sum()), pad_max)
    assert torch.equal(got_torch, ref)
    got = vt.full_mask_triton(tree.visibility.to(DEV), seq_lens.to(DEV), int(padded.sum()),
                              padded_lens=padded.to(DEV), pad_max=pad_max)
    assert got.shape == ref.shape and torch.equal(got.cpu(), ref)
    if pad == "none":  # no padding is the exact layout
        assert torch.equal(ref, full_mask(tree, seq_lens, seq_lens_sum=int(seq_lens.sum())))


def test_padded_full_mask_refuses_a_wrong_sum():
    from sglang_dflash.ddtree.mask import padded_full_mask

    tree, seq_lens = _tree(1, 3, 5, 6, 16)
    with pytest.raises(ValueError, match="is not the sum of padded_lens"):
        padded_full_mask(tree, seq_lens, seq_lens + 2, int(seq_lens.sum()), 2)


def test_the_padded_mask_attends_as_the_exact_one():
    """Attention under the padded mask, over keys [prefix, tree, the pad's slots] whose pad
    holds anything (here large values), equals attention under the exact mask over [prefix,
    tree]: the pad columns get exactly zero weight."""
    from sglang_dflash.ddtree.mask import padded_full_mask

    tree, seq_lens = _tree(2, 3, 6, 5, 16)
    width = tree.tokens.shape[1]
    extra = torch.tensor([0, 5, 70])
    padded = seq_lens + extra
    exact = full_mask(tree, seq_lens, seq_lens_sum=int(seq_lens.sum()))
    pad = padded_full_mask(tree, seq_lens, padded, int(padded.sum()), int(extra.max()))
    gen = torch.Generator().manual_seed(7)
    at_e = at_p = 0
    for b, (s, p) in enumerate(zip(seq_lens.tolist(), padded.tolist(), strict=True)):
        q = torch.randn(width, 8, generator=gen, dtype=torch.float64)
        k = torch.randn(p + width, 8, generator=gen, dtype=torch.float64)
        v = torch.randn(p + width, 8, generator=gen, dtype=torch.float64)
        k[s + width:] *= 1e3  # whatever the pad slots hold
        v[s + width:] *= 1e3
        m_e = exact[at_e: at_e + width * (s + width)].view(width, s + width)
        m_p = pad[at_p: at_p + width * (p + width)].view(width, p + width)
        at_e += width * (s + width)
        at_p += width * (p + width)

        torch.testing.assert_close(_attend(q, k, v, m_p, p + width),
                                   _attend(q, k, v, m_e, s + width),
                                   rtol=0, atol=1e-12, msg=f"request {b}")


def _attend(q, k, v, mask, n):
    scores = (q @ k[:n].T).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v[:n]


def test_the_padded_mask_carries_the_tail_sglang_would_add():
    from sglang_dflash.ddtree.mask import padded_full_mask

    tree, seq_lens = _tree(1, 3, 5, 6, 16)
    padded = seq_lens + 3
    base = padded_full_mask(tree, seq_lens, padded, int(padded.sum()), 3)
    for got in (padded_full_mask(tree, seq_lens, padded, int(padded.sum()), 3, tail=50),
                vt.full_mask_triton(tree.visibility.to(DEV), seq_lens.to(DEV), int(padded.sum()),
                                    padded_lens=padded.to(DEV), pad_max=3, tail=50).cpu()):
        assert got.numel() == base.numel() + 50
        assert torch.equal(got[: base.numel()], base) and bool(got[base.numel():].all())
