"""Adaptive DDTree's counterfactual: a smaller budget's tree is the larger tree's first nodes,
so its accept length is read off the larger tree's walked path (``path_counts``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the DDTree core needs torch")

from sglang_dflash.ddtree.mask import full_mask  # noqa: E402
from sglang_dflash.ddtree.tree import build_tree, root_tree  # noqa: E402
from sglang_dflash.ddtree.walk import greedy_walk  # noqa: E402
from sglang_dflash.sglang_overlay.adaptive import HostEvent, RoundMeter, path_counts  # noqa: E402
from sglang_dflash.sglang_overlay.policy import counterfactual_accept  # noqa: E402
from sglang_dflash.sglang_overlay.verify import (  # noqa: E402
    RootRound,
    build_verify_tensors,
    greedy_accept,
    root_accept,
)

from .test_tree import make_inputs  # noqa: E402
from .test_walk import path_biased_predictions  # noqa: E402


@pytest.mark.parametrize("seed", range(10))
def test_smaller_budget_tree_is_the_larger_trees_prefix(seed):
    logp, ids, roots, seq_lens = make_inputs(seed, 3, 6, 8, ["smooth", "ties", "inf"][seed % 3])
    big = build_tree(logp, ids, roots, seq_lens, 40)
    for n in (1, 3, 7, 15, 31):
        small = build_tree(logp, ids, roots, seq_lens, n)
        assert torch.equal(small.tokens, big.tokens[:, : n + 1])
        assert torch.equal(small.parents, big.parents[:, : n + 1])
        assert torch.equal(small.valid, big.valid[:, : n + 1])


@pytest.mark.parametrize("seed", range(10))
def test_path_counts_equal_walks_of_smaller_trees(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    logp, ids, roots, seq_lens = make_inputs(seed, 4, 7, 6, ["smooth", "ties"][seed % 2])
    n_big = 48
    big = build_tree(logp, ids, roots, seq_lens, n_big)
    pred = path_biased_predictions(big, gen, p_follow=0.9)
    acc = greedy_accept(big, pred)
    budgets = [1, 3, 7, 15, 31, 48]
    sums = path_counts(acc.accept_index, big.width, torch.tensor(budgets))
    for j, n in enumerate(budgets):
        small = build_tree(logp, ids, roots, seq_lens, n)
        res = greedy_walk(small, pred[:, : n + 1])  # the target's choice per node is per prefix
        assert float(sums[j]) == float(res.accept_len.sum()), (n, sums, res.accept_len)
    # the pure per-path helper agrees with the device reduction, request by request
    width = big.width
    for b in range(4):
        nodes = [int(i) - b * width for i in acc.accept_index[b, 1:].tolist() if i >= 0]
        per = counterfactual_accept(nodes, budgets)
        small_lens = [
            int(greedy_walk(build_tree(logp, ids, roots, seq_lens, n), pred[:, : n + 1])
                .commit_lens[b])
            for n in budgets
        ]  # fmt: skip
        assert [per[n] for n in budgets] == small_lens


def test_path_counts_drop_one_node_fails():
    """The check above can fail: an off-by-one budget (index < n) disagrees with some walk."""
    gen = torch.Generator().manual_seed(7)
    logp, ids, roots, seq_lens = make_inputs(3, 4, 7, 6, "smooth")
    big = build_tree(logp, ids, roots, seq_lens, 48)
    pred = path_biased_predictions(big, gen, p_follow=1.0)
    acc = greedy_accept(big, pred)
    budgets = list(range(1, 48))
    wrong = path_counts(acc.accept_index, big.width, torch.tensor(budgets) - 1)
    walks = [
        float(greedy_walk(build_tree(logp, ids, roots, seq_lens, n), pred[:, : n + 1])
              .accept_len.sum())
        for n in budgets
    ]  # fmt: skip
    assert any(float(w) != s for w, s in zip(wrong, walks, strict=True))


def test_root_tree_is_a_plain_decode_step():
    roots = torch.tensor([5, 9, 2])
    seq_lens = torch.tensor([4, 0, 7])
    tree = root_tree(roots, seq_lens, max_depth=15)
    assert tree.width == 1
    choice = torch.tensor([[11], [12], [13]])
    acc = greedy_accept(tree, choice)
    assert acc.commit_lens.tolist() == [1, 1, 1]
    assert acc.bonus.tolist() == [11, 12, 13]
    assert acc.out_tokens.shape == (3, 16)
    assert acc.accept_index[:, 0].tolist() == [0, 1, 2]
    assert (acc.accept_index[:, 1:] == -1).all()
    # the verify mask of a one-node tree lets the root see its whole prefix and itself
    mask = full_mask(tree, seq_lens, seq_lens_sum=int(seq_lens.sum()))
    assert mask.numel() == int(seq_lens.sum()) + 3 and bool(mask.all())
    assert path_counts(acc.accept_index, 1, torch.tensor([1, 3])).tolist() == [0.0, 0.0]
    # SGLang's verify_tree_greedy refuses non-contiguous candidates (H200, 2026-12-02): the
    # roots come as a column of the draft block, which is not contiguous
    block = torch.arange(3 * 16).view(3, 16)
    assert root_tree(block[:, 0], seq_lens, 15).tokens.is_contiguous()


def _dispatched(fn, *args):
    """(result, aten ops dispatched): each op is at least one kernel launch on the GPU."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        out = fn(*args)
    return out, Count.n


def _fields_equal(a, b):
    for name in a._fields if hasattr(a, "_fields") else a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y), name
        else:
            assert x == y, name


def test_root_round_equals_root_tree_and_root_accept_and_costs_less():
    """The budget-0 round's cached tensors give exactly the fresh tree and acceptance, in
    fewer ops (a no-draft round competes with plain decoding); rounds do not leak into each
    other through the shared tensors."""
    rr = RootRound(3, 15, "cpu")
    for step in range(3):
        roots = torch.tensor([5, 9, 2]) + step
        seq_lens = torch.tensor([4, 0, 7]) + step
        choice = torch.tensor([[11], [12], [13]]) * (step + 1)
        fresh_tree, n_fresh_tree = _dispatched(root_tree, roots, seq_lens, 15)
        fresh_acc, n_fresh_acc = _dispatched(root_accept, choice, 15)
        tree, n_tree = _dispatched(rr.tree, roots, seq_lens)
        acc, n_acc = _dispatched(rr.accept, choice)
        _fields_equal(tree, fresh_tree)
        _fields_equal(acc, fresh_acc)
        assert n_tree + n_acc <= 6 < n_fresh_tree + n_fresh_acc
    # a column of the draft block (not contiguous) still gives contiguous tokens
    block = torch.arange(3 * 16).view(3, 16)
    assert rr.tree(block[:, 0], seq_lens).tokens.is_contiguous()


def test_width_one_mask_is_all_true_without_the_scatter():
    tree = root_tree(torch.tensor([1, 2]), torch.tensor([3, 5]), 15)
    vt, n = _dispatched(build_verify_tensors, tree, torch.tensor([3, 5]), 8 + 2)
    assert vt.custom_mask.numel() == 8 + 2 + 2 and bool(vt.custom_mask.all())
    big = build_tree(*make_inputs(0, 2, 6, 8, "smooth")[:2], torch.tensor([1, 2]),
                     torch.tensor([3, 5]), 7)
    _, n_big = _dispatched(build_verify_tensors, big, torch.tensor([3, 5]), 10)
    assert n <= 5 < n_big


def test_meter_hands_back_rounds_in_order_with_means():
    meter = RoundMeter(HostEvent, pin=False, depth=2)
    for r in range(3):
        meter.begin()
        meter.end(key=8, ran=7, bs=4, budgets=(3, 7), counts=torch.tensor([4.0 * r, 8.0]))
    # a round is complete when the next one starts: rounds 0 and 1 are, round 2 is still open
    assert meter.dropped == 0
    recs = meter.drain()
    assert [r.accept_by_budget for r in recs] == [{3: 1.0, 7: 3.0}, {3: 2.0, 7: 3.0}]
    assert all(r.key == 8 and r.ran == 7 and r.cost_ms >= 0 for r in recs)
    assert meter.drain() == []
    meter.begin()  # round 3 starts: round 2 closes
    assert [r.accept_by_budget[3] for r in meter.drain()] == [3.0]


def test_meter_depth_drops_the_oldest_without_waiting():
    meter = RoundMeter(HostEvent, pin=False, depth=2)
    for r in range(4):
        meter.begin()
        meter.end(key=1, ran=3, bs=1, budgets=(3,), counts=torch.tensor([float(r)]))
    meter.begin()
    assert meter.dropped == 2
    assert [r.accept_by_budget[3] for r in meter.drain()] == [3.0, 4.0]


class _ClockEvent:
    """A host event on a fake clock, so the test knows every interval."""

    now = 0.0

    def __init__(self):
        self.t = None

    def record(self):
        self.t = _ClockEvent.now

    def elapsed_time(self, end):
        return end.t - self.t


def test_meter_cost_runs_to_the_next_rounds_start_and_interrupts_drop_it():
    """The cost of a round is start -> next start (scheduler time and GPU idle included), not
    the round's own span; a prefill between two rounds leaves that round without a cost."""
    meter = RoundMeter(_ClockEvent, pin=False)
    for start, span in ((0.0, 2.0), (3.5, 2.5)):
        _ClockEvent.now = start
        meter.begin()
        _ClockEvent.now = start + span
        meter.end(key=1, ran=0, bs=1, budgets=(), counts=None)
    meter.interrupt()  # a prefill runs next
    _ClockEvent.now = 9.0
    meter.begin()
    meter.end(key=1, ran=0, bs=1, budgets=(), counts=None)
    _ClockEvent.now = 10.0
    meter.begin()
    recs = meter.drain()
    assert [r.cost_ms for r in recs] == [3.5, None, 1.0]
    assert all(r.accept_by_budget == {} for r in recs)


def test_meter_a_pause_between_rounds_is_not_a_cost():
    """A server that stops between two rounds (a profiler writing its trace, a control
    request) leaves a start-to-start gap that is no round's cost: the policy must not see a
    33 ms round as 869 ms (H200, §23). Gaps of a busy server (1-2.5x the span) still count."""
    from sglang_dflash.sglang_overlay.adaptive import PAUSE_SLACK_MS, is_pause

    assert not is_pause(61.0, 26.0) and not is_pause(4.8, 2.0) and not is_pause(50.0, 0.0)
    assert is_pause(869.0, 26.0) and is_pause(3.0 * 26.0 + PAUSE_SLACK_MS + 0.1, 26.0)
    meter = RoundMeter(_ClockEvent, pin=False)
    for start, span in ((0.0, 26.0), (33.0, 26.0), (902.0, 26.0)):
        _ClockEvent.now = start
        meter.begin()
        _ClockEvent.now = start + span
        meter.end(key=1, ran=0, bs=1, budgets=(), counts=None)
    _ClockEvent.now = 935.0
    meter.begin()
    assert [r.cost_ms for r in meter.drain()] == [33.0, None, 33.0]


@pytest.mark.parametrize("bs,depth", [(1, 15), (3, 7), (8, 0)])
def test_root_accept_equals_the_walk_of_a_root_tree(bs, depth):
    g = torch.Generator().manual_seed(bs * 31 + depth)
    roots = torch.randint(0, 100, (bs,), generator=g)
    seq_lens = torch.randint(0, 50, (bs,), generator=g)
    choice = torch.randint(0, 100, (bs, 1), generator=g)
    want = greedy_accept(root_tree(roots, seq_lens, depth), choice)
    got = root_accept(choice, depth)
    for name, a, b in zip(want._fields, want, got, strict=True):
        if a is None or b is None:  # the optional fields the fused CUDA tail fills
            assert a is None and b is None, name
            continue
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), name


def _path_target(tree, ids, table):
    """The target's choice after every node of ``tree``, as a function of the node's rank path
    (the context): ``table[path]`` is a rank at the next depth, or -1 for a token no draft has."""
    bs, width = tree.tokens.shape
    depth = ids.shape[1]
    pred = torch.full((bs, width), 99, dtype=torch.long)
    for b in range(bs):
        paths = {0: ()}
        for i in range(1, int(tree.num_nodes[b])):
            paths[i] = (*paths[int(tree.parents[b, i])], int(tree.ranks[b, i]))
        for i, path in paths.items():
            r = table[b].get(path, -1)
            if len(path) < depth and r >= 0:
                pred[b, i] = ids[b, len(path), r]
    return pred


@pytest.mark.parametrize("seed", range(12))
def test_chain_counts_read_the_chains_accept_off_a_trees_walk(seed):
    """The chain rung's counterfactual from a tree round: the walked path's leading rank-0
    nodes. Against a walk of the chain itself under the same target (its choices a function of
    the path): equal when the tree holds every prefix, never above it when the tree is cut."""
    import itertools

    from sglang_dflash.ddtree.tree import chain_tree
    from sglang_dflash.sglang_overlay.adaptive import chain_counts

    gen = torch.Generator().manual_seed(500 + seed)
    bs, depth, k = 4, 3, 3
    logp, ids, roots, seq_lens = make_inputs(seed, bs, depth, k, ["smooth", "ties"][seed % 2])
    paths = [p for d in range(depth) for p in itertools.product(range(k), repeat=d)]
    # the target takes the rank-0 draft 60 % of the time, another rank 25 %, none 15 %
    table = []
    for _ in range(bs):
        row = {}
        for p in paths:
            u = float(torch.rand(1, generator=gen))
            row[p] = 0 if u < 0.6 else (int(torch.randint(1, k, (1,), generator=gen))
                                        if u < 0.85 else -1)
        table.append(row)
    chain = chain_tree(logp, ids, roots, seq_lens)
    want = greedy_walk(chain, _path_target(chain, ids, table)).accept_len
    whole = sum(k ** d for d in range(1, depth + 1))
    for n in (whole, 7, 3, 1):
        tree = build_tree(logp, ids, roots, seq_lens, n)
        acc = greedy_accept(tree, _path_target(tree, ids, table))
        got = float(chain_counts(acc.accept_index, tree.ranks, tree.width))
        if n == whole:  # every prefix is finite (no "inf" mode here): all are in the tree
            assert got == float(want.sum()), (n, got, want)
        assert got <= float(want.sum())
