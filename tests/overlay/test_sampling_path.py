"""The DDTree T > 0 path on the CPU: degenerate rows, termination, kernel choice.

A first T = 0.8 / top_p = 0.95 request can stall a planted DDTree server with no traceback
(seen on the H200, docs/gpu-results.md). These tests pin what the sampling path must never do:
raise or sync on a degenerate distribution, walk a cyclic LCRS link, or load FlashInfer's
JIT-built sampling module in the middle of serving when the operator chose
``--sampling-backend pytorch``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the DDTree overlay needs torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sglang_dflash.ddtree.tree import build_tree  # noqa: E402
from sglang_dflash.sglang_overlay import verify as v  # noqa: E402

VOCAB = 12


def test_degenerate_rows_give_a_defined_token_not_an_error():
    logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(0))
    logits[1] = float("-inf")  # every token masked (a grammar/logit-bias corner)
    logits[2, 3] = float("nan")
    logits[3, 7] = float("inf")
    logits[4, :] = float("-inf")
    logits[4, 9] = 0.0  # one admissible token
    # temperature 0.8, top_p 0.95: what the call-14 smoke requests asked for
    got = v.per_node_targets(
        logits, 1, torch.full((5,), 0.8), top_ps=torch.full((5,), 0.95),
        generator=torch.Generator().manual_seed(1),
    )  # fmt: skip
    got = got.view(-1)
    assert ((got >= 0) & (got < VOCAB)).all()
    assert int(got[3]) == 7  # +inf logit: the only finite-logit argmax that makes sense
    assert int(got[4]) == 9  # the single admissible token is always drawn


def test_draw_rows_falls_back_to_the_finite_argmax_on_non_distributions():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, float("nan"), 1.0], [0.5, 0.1, 4.0]])
    probs = torch.tensor([[float("nan"), 0.5, 0.5], [0.0, 0.0, 0.0], [-0.1, 0.6, 0.5]])
    got = v.draw_rows(probs, logits).view(-1).tolist()
    assert got == [1, 0, 2]


def test_draw_rows_is_an_exact_categorical_sample():
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0]]).repeat(20_000, 1)
    draws = v.draw_rows(probs, torch.zeros_like(probs), torch.Generator().manual_seed(4))
    freq = torch.bincount(draws.view(-1), minlength=4).float() / 20_000
    assert freq[3] == 0  # a zero-probability token is never drawn
    assert torch.allclose(freq, probs[0], atol=0.015)


def test_sampling_path_has_no_host_sync():
    """Meta tensors have no data: any .item()/.tolist() in the T > 0 path raises here."""
    rows, width = 2 * 57, 57
    logits = torch.empty(rows, 151_936, device="meta")
    got = v.per_node_targets(
        logits, width, torch.empty(2, 1, device="meta"), top_ps=torch.empty(2, device="meta")
    )
    assert got.shape == (2, width)


def test_fused_renorm_only_when_the_operator_allows_flashinfer():
    assert not v.use_fused_renorm("pytorch", on_cuda=True)  # the stalled server's setting
    assert v.use_fused_renorm("flashinfer", on_cuda=True)
    assert v.use_fused_renorm(None, on_cuda=True)  # SGLang's default on CUDA
    assert not v.use_fused_renorm("flashinfer", on_cuda=False)


def test_warm_up_calls_both_kernels_with_sgl_kernel_argument_types():
    seen = []

    def top_k(probs, k):
        seen.append(("k", probs.shape, k.dtype))
        return probs

    def top_p(probs, p):
        seen.append(("p", probs.shape, p.dtype))
        return probs

    v.warm_up_renorm((top_k, top_p), "cpu")
    assert seen == [("k", (2, 8), torch.int32), ("p", (2, 8), torch.float32)]


def _kernel_walk(tree, choice, b):
    """sgl_kernel verify_tree_greedy's loop for request b, counting every link it follows."""
    steps = tree.max_depth + 1
    hops, cur, last, n_acc = 0, 0, 0, 0
    for _ in range(1, steps):
        cur = int(tree.next_token[b, cur])
        want = int(choice[b, last])
        while cur != -1:
            hops += 1
            assert hops <= tree.width, "sibling/child links form a cycle"
            if int(tree.tokens[b, cur]) == want:
                n_acc, last = n_acc + 1, cur
                break
            cur = int(tree.next_sibling[b, cur])
        if cur == -1:
            break
    return n_acc, hops


_SCORES = st.sampled_from([0.0, -0.5, -1.0, -1.0, -3.0, float("-inf"), float("nan")])


@settings(max_examples=60, deadline=None)
@given(
    depth=st.integers(1, 5),
    k=st.integers(1, 6),
    budget=st.integers(1, 40),
    data=st.data(),
)
def test_lcrs_links_are_acyclic_and_the_walk_terminates(depth, k, budget, data):
    """Ties, -inf and NaN log-probs and random sampled choices: links only go forward."""
    bs = 2
    flat = data.draw(st.lists(_SCORES, min_size=bs * depth * k, max_size=bs * depth * k))
    logp = torch.tensor(flat).view(bs, depth, k)
    logp = logp.sort(-1, descending=True).values  # top-K rows come sorted
    ids = torch.stack([torch.randperm(30)[:k] for _ in range(bs * depth)]).view(bs, depth, k)
    tree = build_tree(logp, ids, torch.tensor([40, 41]), torch.tensor([3, 8]), budget)
    w = tree.width
    for b in range(bs):
        for i in range(w):
            nt, ns = int(tree.next_token[b, i]), int(tree.next_sibling[b, i])
            assert nt == -1 or (nt > i and int(tree.depths[b, nt]) == int(tree.depths[b, i]) + 1)
            assert ns == -1 or ns > i
    choice = torch.randint(0, 45, (bs, w))
    for b in range(bs):
        n_acc, _ = _kernel_walk(tree, choice, b)
        assert 0 <= n_acc <= tree.max_depth
    acc = v.greedy_accept(tree, choice)
    assert ((acc.accept_len >= 0) & (acc.accept_len <= tree.max_depth)).all()


@pytest.mark.parametrize("seed", range(3))
def test_sampled_walk_matches_the_kernel_loop(seed):
    gen = torch.Generator().manual_seed(seed)
    bs, depth, k = 2, 4, 3
    logp, ids = torch.log_softmax(torch.randn(bs, depth, 9, generator=gen), -1).topk(k, -1)
    tree = build_tree(logp, ids, torch.tensor([1, 2]), torch.tensor([5, 6]), 10)
    logits = torch.randn(bs * tree.width, 9, generator=gen)
    choice = v.per_node_targets(
        logits, tree.width, torch.tensor([0.8, 0.8]), top_ps=torch.tensor([0.95, 0.95]),
        generator=gen,
    )  # fmt: skip
    acc = v.greedy_accept(tree, choice)
    for b in range(bs):
        assert int(acc.accept_len[b]) == _kernel_walk(tree, choice, b)[0]
