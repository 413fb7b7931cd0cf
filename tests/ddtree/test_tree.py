"""Tree selection, invariants, masks and the no-host-sync property (items a, b)."""

from __future__ import annotations

import itertools
import math

import pytest

torch = pytest.importorskip("torch", reason="the DDTree core needs torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sglang_dflash.ddtree.mask import full_mask, qlen_mask  # noqa: E402
from sglang_dflash.ddtree.reference import build_tree_reference  # noqa: E402
from sglang_dflash.ddtree.topk import topk_logprobs  # noqa: E402
from sglang_dflash.ddtree.tree import build_tree  # noqa: E402
from sglang_dflash.ddtree.walk import greedy_walk  # noqa: E402


def make_inputs(seed: int, bs: int, depth: int, k: int, mode: str):
    """Per-depth sorted log-probs. 'ties' uses a coarse grid (many exact ties, zeros);
    'inf' makes some tokens impossible (-inf); 'smooth' is a plain log-softmax."""
    gen = torch.Generator().manual_seed(seed)
    if mode == "ties":
        x = -0.5 * torch.randint(0, 3, (bs, depth, k), generator=gen).float()
    else:
        x = torch.log_softmax(torch.randn(bs, depth, k, generator=gen) * 2, -1)
        if mode == "inf":
            x = x.masked_fill(torch.rand(bs, depth, k, generator=gen) < 0.3, float("-inf"))
    logp = torch.sort(x, -1, descending=True).values
    ids = torch.stack([torch.randperm(50, generator=gen)[:k] for _ in range(bs * depth)])
    seq_lens = torch.randint(0, 20, (bs,), generator=gen)
    roots = torch.randint(0, 50, (bs,), generator=gen)
    return logp, ids.view(bs, depth, k), roots, seq_lens


def brute_force(logp: torch.Tensor, budget: int) -> list[tuple[int, ...]]:
    """Every finite prefix, enumerated; the best ``budget`` by the documented heap key:
    float32 prefix score desc, depth asc, parent's order asc, rank asc."""
    depth, k = logp.shape
    rows = logp.tolist()
    order_of: dict[tuple[int, ...], int] = {(): 0}
    score_of: dict[tuple[int, ...], torch.Tensor] = {(): torch.tensor(0.0)}
    ranked = []
    for d in range(1, depth + 1):
        level = []
        for tup in itertools.product(range(k), repeat=d):
            if tup[:-1] not in order_of:
                continue
            s = score_of[tup[:-1]] + torch.tensor(rows[d - 1][tup[-1]])  # float32 add
            if not math.isinf(s.item()):
                score_of[tup] = s
                level.append((-s.item(), order_of[tup[:-1]], tup[-1], tup))
        level.sort()
        for pos, (neg, _, _, tup) in enumerate(level):
            order_of[tup] = pos
            ranked.append((neg, d, pos, tup))
    ranked.sort()
    return [tup for *_, tup in ranked[:budget]]


def rank_tuples(tree, b: int) -> list[tuple[int, ...]]:
    n = int(tree.num_nodes[b])
    par, rk = tree.parents[b].tolist(), tree.ranks[b].tolist()
    out: list[tuple[int, ...]] = [()]
    for i in range(1, n):
        out.append((*out[par[i]], rk[i]))
    return out[1:]


MODES = st.sampled_from(["smooth", "ties", "inf"])


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    depth=st.integers(1, 4),
    k=st.integers(1, 4),
    budget=st.integers(1, 40),
    mode=MODES,
)
def test_selection_equals_brute_force_top_n(seed, depth, k, budget, mode):
    logp, ids, roots, seq_lens = make_inputs(seed, 2, depth, k, mode)
    tree = build_tree(logp, ids, roots, seq_lens, budget)
    for b in range(2):
        want = brute_force(logp[b], budget)
        assert rank_tuples(tree, b) == want
        assert int(tree.num_nodes[b]) == len(want) + 1
        toks = tree.tokens[b, 1 : len(want) + 1].tolist()
        assert toks == [int(ids[b, len(t) - 1, t[-1]]) for t in want]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    bs=st.integers(1, 3),
    depth=st.integers(1, 7),
    k=st.integers(1, 12),
    budget=st.integers(1, 80),
    mode=MODES,
)
def test_selection_equals_heap_reference(seed, bs, depth, k, budget, mode):
    logp, ids, roots, seq_lens = make_inputs(seed, bs, depth, k, mode)
    tree = build_tree(logp, ids, roots, seq_lens, budget)
    for b in range(bs):
        ref = build_tree_reference(
            logp[b].tolist(), ids[b].tolist(), int(roots[b]), int(seq_lens[b]), budget
        )
        n = len(ref.tokens)
        assert int(tree.num_nodes[b]) == n
        assert tree.tokens[b, :n].tolist() == ref.tokens
        assert tree.parents[b, :n].tolist() == ref.parents
        assert tree.depths[b, :n].tolist() == ref.depths
        assert tree.ranks[b, :n].tolist() == ref.ranks
        assert tree.scores[b, :n].tolist() == ref.scores
        assert tree.positions[b, :n].tolist() == ref.positions
        assert tree.next_token[b, :n].tolist() == ref.next_token
        assert tree.next_sibling[b, :n].tolist() == ref.next_sibling
        assert tree.visibility[b, :n, :n].tolist() == ref.visibility


def check_invariants(tree, seq_lens):
    bs, width = tree.tokens.shape
    for name in ("tokens", "parents", "depths", "ranks", "scores", "visibility",
                 "retrieve_index", "next_token", "next_sibling", "positions", "valid"):
        assert getattr(tree, name).is_contiguous(), f"{name}: CUDA kernels read raw strides"
    assert tree.tokens.dtype == tree.next_token.dtype == tree.retrieve_index.dtype == torch.long
    for b in range(bs):
        n = int(tree.num_nodes[b])
        par, dep = tree.parents[b].tolist(), tree.depths[b].tolist()
        vis = tree.visibility[b]
        assert par[0] == -1 and dep[0] == 0
        assert vis[0].tolist() == [j == 0 for j in range(width)]
        for i in range(1, width):
            if i < n:
                assert 0 <= par[i] < i, "parent before child"
                assert dep[i] == dep[par[i]] + 1
                want = vis[par[i]].clone()
                want[i] = True
                assert torch.equal(vis[i], want), "row = parent's row + self"
            else:  # padding: unlinked, sees only itself
                assert par[i] == -1 and not tree.valid[b, i]
                assert vis[i].tolist() == [j == i for j in range(width)]
        assert tree.positions[b].tolist() == [int(seq_lens[b]) + d for d in dep]
        assert tree.retrieve_index[b].tolist() == [b * width + i for i in range(width)]
        assert torch.all(vis.any(1)), "no fully masked row"
        # LCRS: the sibling chain from next_token lists exactly the children, in index order
        for p in range(n):
            chain, c = [], int(tree.next_token[b, p])
            while c != -1:
                chain.append(c)
                c = int(tree.next_sibling[b, c])
            kids = [i for i in range(1, n) if par[i] == p]
            assert chain == kids
            toks = [int(tree.tokens[b, c]) for c in kids]
            assert len(set(toks)) == len(toks), "siblings have distinct tokens"
        # the first-child walk from the root is the rank-0 spine
        c = int(tree.next_token[b, 0])
        while c != -1:
            assert int(tree.ranks[b, c]) == 0
            c = int(tree.next_token[b, c])


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    depth=st.integers(1, 6),
    k=st.integers(1, 8),
    budget=st.integers(1, 60),
    mode=MODES,
)
def test_tree_invariants(seed, depth, k, budget, mode):
    logp, ids, roots, seq_lens = make_inputs(seed, 3, depth, k, mode)
    check_invariants(build_tree(logp, ids, roots, seq_lens, budget), seq_lens)


def test_full_mask_layout_matches_per_request_blocks():
    logp, ids, roots, _ = make_inputs(11, 4, 5, 6, "smooth")
    seq_lens = torch.tensor([0, 3, 17, 1])
    tree = build_tree(logp, ids, roots, seq_lens, 20)
    width = tree.width
    flat = full_mask(tree, seq_lens, seq_lens_sum=int(seq_lens.sum()))
    blocks = [
        torch.cat([torch.ones(width, int(s), dtype=torch.bool), tree.visibility[b]], 1).reshape(-1)
        for b, s in enumerate(seq_lens.tolist())
    ]
    assert torch.equal(flat, torch.cat(blocks))
    assert flat.numel() == int(seq_lens.sum()) * width + 4 * width * width
    # same result through a larger preallocated buffer (SGLang-style padding stays True)
    buf = torch.zeros(flat.numel() + 50, dtype=torch.bool)
    full_mask(tree, seq_lens, out=buf)
    assert torch.equal(buf[: flat.numel()], flat) and buf[flat.numel() :].all()
    buf.zero_()
    full_mask(tree, seq_lens, seq_lens_sum=int(seq_lens.sum()), out=buf)
    assert torch.equal(buf[: flat.numel()], flat) and not buf[flat.numel() :].any()
    # an upper bound on the prefix sum (SGLang's host bound under overlap) keeps the layout
    loose = full_mask(tree, seq_lens, seq_lens_sum=int(seq_lens.sum()) + 7)
    assert torch.equal(loose[: flat.numel()], flat) and loose[flat.numel() :].all()
    assert torch.equal(qlen_mask(tree), tree.visibility.reshape(-1))


def test_padding_rows_when_fewer_prefixes_than_budget():
    logp = torch.zeros(1, 3, 1)  # K=1, L=3: only 3 prefixes exist
    ids = torch.tensor([[[5], [6], [7]]])
    tree = build_tree(logp, ids, torch.tensor([9]), torch.tensor([4]), 8)
    assert tree.width == 9 and int(tree.num_nodes[0]) == 4
    assert tree.tokens[0, :4].tolist() == [9, 5, 6, 7]
    assert tree.parents[0].tolist() == [-1, 0, 1, 2, -1, -1, -1, -1, -1]
    check_invariants(tree, torch.tensor([4]))
    flat = full_mask(tree, torch.tensor([4]))
    assert flat.view(9, 13).any(1).all()


def test_pipeline_has_no_host_sync():
    """Meta tensors carry no data: any .item()/.tolist()/.cpu() or data-dependent shape
    raises, so running the whole device path on 'meta' proves it never syncs."""
    dev, bs, depth, k, n = "meta", 4, 15, 32, 64
    logp, ids = topk_logprobs(torch.randn(bs * depth, 1000, device=dev), k)
    z = torch.zeros(bs, dtype=torch.long, device=dev)
    tree = build_tree(logp.view(bs, depth, k), ids.view(bs, depth, k), z, z, n)
    res = greedy_walk(tree, torch.zeros(bs, n + 1, dtype=torch.long, device=dev))
    mask = full_mask(tree, z, seq_lens_sum=100)
    assert tree.visibility.shape == (bs, n + 1, n + 1) and res.accept_index.shape == (bs, 16)
    assert mask.shape == (100 * (n + 1) + bs * (n + 1) ** 2,)
    with pytest.raises((NotImplementedError, RuntimeError)):
        full_mask(tree, z)  # without seq_lens_sum the total is read back: caught here


def test_package_imports_without_torch(tmp_path):
    """The CLI imports sglang_dflash in environments without torch: the ddtree package file
    itself must not pull torch in (only its submodules do)."""
    import subprocess
    import sys

    code = "import sys, sglang_dflash, sglang_dflash.ddtree; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path)
    assert out.stdout.strip() == "False"


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), depth=st.integers(1, 15), k=st.integers(1, 6))
def test_chain_tree_is_the_best_first_tree_when_rank_0_dominates(seed, depth, k):
    """With the top token far above the rest at every depth, the best-first tree of budget L
    is the rank-0 chain: ``chain_tree`` must give the same tree, field by field."""
    logp, ids, roots, seq_lens = make_inputs(seed, 3, depth, k, "smooth")
    logp = torch.cat([torch.zeros(3, depth, 1), logp[:, :, 1:] - 1e4], -1)
    from sglang_dflash.ddtree.tree import chain_tree

    got, want = chain_tree(logp, ids, roots, seq_lens), build_tree(logp, ids, roots, seq_lens,
                                                                   depth)
    for name in ("tokens", "parents", "depths", "ranks", "visibility", "retrieve_index",
                 "next_token", "next_sibling", "positions", "valid", "num_nodes"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert got.max_depth == want.max_depth
    check_invariants(got, seq_lens)


def test_chain_tree_ends_at_an_impossible_depth_and_walks_as_a_prefix_match():
    from sglang_dflash.ddtree.tree import chain_tree

    logp = torch.tensor([[[-0.1, -2.0], [-0.2, -3.0], [float("-inf")] * 2, [-0.1, -1.0]],
                         [[-0.5, -0.9], [-0.1, -4.0], [-0.3, -0.4], [-0.2, -0.3]]])
    ids = torch.tensor([[[5, 6], [7, 8], [9, 10], [11, 12]],
                        [[1, 2], [3, 4], [5, 6], [7, 8]]])
    tree = chain_tree(logp, ids, torch.tensor([40, 41]), torch.tensor([3, 10]))
    assert tree.width == 5 and tree.num_nodes.tolist() == [3, 5]
    assert tree.tokens.tolist() == [[40, 5, 7, 0, 0], [41, 1, 3, 5, 7]]
    assert tree.parents.tolist() == [[-1, 0, 1, -1, -1], [-1, 0, 1, 2, 3]]
    assert tree.positions[1].tolist() == [10, 11, 12, 13, 14]
    # the visibility of a chain is causal: a verify of it needs no mask
    assert torch.equal(tree.visibility[1], torch.ones(5, 5, dtype=torch.bool).tril())
    check_invariants(tree, torch.tensor([3, 10]))
    # the target agrees with 1, 3 then says 9 (not 5): accept 2 drafts, bonus 9
    pred = torch.tensor([[5, 7, 99, 0, 0], [1, 3, 9, 7, 8]])
    res = greedy_walk(tree, pred)
    assert res.accept_len.tolist() == [2, 2] and res.bonus.tolist() == [99, 9]
