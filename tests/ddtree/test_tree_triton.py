"""The Triton tree builder gives the torch builder's tree, field for field, ties included.

Without a GPU the kernel runs under the Triton interpreter (TRITON_INTERPRET=1, CPU tensors),
so shapes stay small; with CUDA it runs compiled on the device. A subprocess also compiles the
kernel for sm_90 (no GPU needed) so lowering errors the interpreter cannot see are caught here.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="the DDTree core needs torch")
from sglang_dflash.ddtree import tree as tree_mod  # noqa: E402
from sglang_dflash.ddtree.tree import build_tree_torch  # noqa: E402

from .test_tree import check_invariants, make_inputs  # noqa: E402
from .triton_env import (  # noqa: E402
    CUDA,
    DEV,
    import_triton_module,
    lower_for_sm90,
)

tt = import_triton_module("sglang_dflash.ddtree.tree_triton")
pytestmark = pytest.mark.usefixtures("triton_interpret")


FIELDS = ("tokens", "parents", "depths", "ranks", "scores", "visibility", "retrieve_index",
          "next_token", "next_sibling", "positions", "valid", "num_nodes")


def assert_same_tree(a, b) -> None:
    assert a.max_depth == b.max_depth
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert y.is_contiguous(), name
        assert torch.equal(x.cpu(), y.cpu()), name


def both(bs, depth, k, budget, mode, seed=0, dtype=torch.float32):
    logp, ids, roots, seq_lens = make_inputs(seed, bs, depth, k, mode)
    logp = logp.to(dtype)
    ref = build_tree_torch(logp, ids, roots, seq_lens, budget)
    got = tt.build_tree_triton(logp.to(DEV), ids.to(DEV), roots.to(DEV), seq_lens.to(DEV),
                               budget)
    return ref, got, seq_lens


@pytest.mark.parametrize("mode", ["smooth", "ties", "inf"])
@pytest.mark.parametrize(
    ("bs", "depth", "k", "budget"),
    [
        (1, 1, 1, 1),  # smallest tree; bs, L, K = 1 are specialised by triton
        (2, 3, 4, 10),
        (3, 5, 6, 40),
        (2, 3, 2, 20),  # only 14 prefixes exist: padding rows
        (1, 2, 9, 3),  # K > N
        (2, 7, 3, 100),  # W = 101: row blocks of the visibility pass
    ],
)
def test_triton_equals_torch(bs, depth, k, budget, mode):
    ref, got, seq_lens = both(bs, depth, k, budget, mode, seed=bs * 100 + depth * 10 + k)
    assert_same_tree(ref, got)
    check_invariants(tree_mod.DDTree(**{f: getattr(got, f).cpu() for f in FIELDS},
                                     max_depth=got.max_depth), seq_lens)


@pytest.mark.parametrize("mode", ["smooth", "ties"])
def test_triton_equals_torch_serving_shape(mode):
    """L = 15, N = 64 (W = 65, past one 64-bit word), K = 48, as in the benchmark's main row."""
    ref, got, _ = both(3, 15, 48, 64, mode, seed=7)
    assert_same_tree(ref, got)


def test_triton_bf16_logits_and_int32_ids():
    logp, ids, roots, seq_lens = make_inputs(5, 2, 4, 8, "ties")
    logp = logp.to(torch.bfloat16)
    ref = build_tree_torch(logp, ids, roots, seq_lens, 30)
    got = tt.build_tree_triton(logp.to(DEV), ids.int().to(DEV), roots.to(DEV),
                               seq_lens.to(DEV), 30)
    assert_same_tree(ref, got)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    bs=st.integers(1, 3),
    depth=st.integers(1, 6),
    k=st.integers(1, 10),
    budget=st.integers(1, 48),
    mode=st.sampled_from(["smooth", "ties", "inf"]),
)
def test_triton_equals_torch_random(seed, bs, depth, k, budget, mode):
    ref, got, _ = both(bs, depth, k, budget, mode, seed=seed)
    assert_same_tree(ref, got)


def test_triton_rejects_bad_shapes():
    logp, ids, roots, seq_lens = make_inputs(0, 1, 2, 3, "smooth")
    with pytest.raises(ValueError, match="budget"):
        tt.build_tree_triton(logp, ids, roots, seq_lens, 0)
    with pytest.raises(ValueError, match="one shape"):
        tt.build_tree_triton(logp, ids[:, :1], roots, seq_lens, 4)


def test_dispatch():
    """CPU tensors take the torch path; CUDA tensors the kernel, unless the env forces torch."""
    assert tree_mod.triton_module("sglang_dflash.ddtree.tree_triton") is not None
    if not CUDA:
        pytest.skip("no CUDA device: dispatch to the kernel is only reachable with CUDA tensors")
    logp, ids, roots, seq_lens = (t.cuda() for t in make_inputs(3, 4, 15, 32, "ties"))
    assert_same_tree(build_tree_torch(logp, ids, roots, seq_lens, 64),
                     tree_mod.build_tree(logp, ids, roots, seq_lens, 64))


COMPILE = """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from sglang_dflash.ddtree import tree_triton as tt
    sig = {"logp_ptr": "*fp32", "ids_ptr": "*i64", "root_ptr": "*i64", "seq_ptr": "*i64",
           "out_i64_ptr": "*i64", "scores_ptr": "*fp32", "valid_ptr": "*i1", "vis_ptr": "*i1",
           "count_ptr": "*i64", "plane": "i32", "K": "i32", "L": "constexpr", "N": "constexpr",
           "W": "constexpr", "WP": "constexpr", "BR": "constexpr"}
    for n in (16, 64, 256):
        w = n + 1
        wp = triton.next_power_of_2(w)
        src = ASTSource(fn=tt._ddtree_kernel, signature=sig,
                        constexprs={"L": 15, "N": n, "W": w, "WP": wp, "BR": tt._rows(wp)})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": tt._num_warps(wp)})
        assert k.asm["cubin"], n
        print(n, "cubin", len(k.asm["cubin"]))
    print("unspecialised", *[p.name for p in tt._ddtree_kernel.params if p.do_not_specialize])
    print("ok")
"""


def test_kernel_compiles_for_sm90():
    """Lower the kernel to an H200 (sm_90) cubin with triton's bundled ptxas: no GPU needed."""
    lines = lower_for_sm90(COMPILE)
    assert [line.split()[0] for line in lines[:3]] == ["16", "64", "256"]
    # bs x W and K would otherwise be specialised (== 1, % 16 == 0): a batch size with
    # 16 | bs*(N+1) compiled a second variant mid-serving on the H200 (docs/gpu-results.md §8).
    assert lines[3].split() == ["unspecialised", "plane", "K"]


@pytest.mark.parametrize(("depth", "k", "budget"), [(15, 56, 56), (15, 100, 256), (1, 4, 3)])
def test_warm_up_inputs_build_a_full_tree(depth, k, budget):
    """The worker's start-up call: valid inputs whatever the budget, K and depth."""
    logp, ids, root, seq = tree_mod.warm_up_inputs(depth, k, DEV)
    got = tt.build_tree_triton(logp, ids, root, seq, budget)
    ref = build_tree_torch(logp.cpu(), ids.cpu(), root.cpu(), seq.cpu(), budget)
    assert_same_tree(ref, got)
    assert int(got.num_nodes[0]) == budget + 1
