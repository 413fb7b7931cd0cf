"""Verify-input building and the accept/compact index math, on CPU with small tensors."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the DDTree overlay needs torch")

from sglang_dflash.ddtree.tree import build_tree  # noqa: E402
from sglang_dflash.sglang_overlay import verify as v  # noqa: E402


def _tree(bs=2, depth=3, k=3, budget=6, seed=0, prefix=(5, 9)):
    gen = torch.Generator().manual_seed(seed)
    logp = torch.log_softmax(torch.randn(bs, depth, 40, generator=gen) * 2, -1)
    logp, ids = logp.topk(k, dim=-1)
    roots = torch.tensor([100 + b for b in range(bs)])
    seq = torch.tensor(prefix[:bs])
    return build_tree(logp, ids, roots, seq, budget), seq


def test_verify_tensors_full_mask_layout():
    tree, seq = _tree()
    bs, w = tree.tokens.shape
    host_sum = int(seq.sum()) + 7  # an over-estimate, as overlap scheduling provides
    vt = v.build_verify_tensors(tree, seq, host_sum)
    assert vt.tokens.tolist() == tree.tokens.reshape(-1).tolist()
    assert vt.positions.tolist() == (seq.view(-1, 1) + tree.depths).reshape(-1).tolist()
    assert vt.custom_mask.dtype == torch.bool
    assert vt.custom_mask.numel() == host_sum * w + bs * w * w
    start = 0
    for b in range(bs):
        s = int(seq[b])
        block = vt.custom_mask[start : start + w * (s + w)].view(w, s + w)
        assert block[:, :s].all()  # the committed prefix is visible to every node
        assert torch.equal(block[:, s:], tree.visibility[b])  # ancestor-or-self
        start += w * (s + w)
    assert vt.custom_mask[start:].all()  # padding tail stays True


def _py_verify_tree_greedy(
    *,
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    retrieve_index,
    retrieve_next_token,
    retrieve_next_sibling,
    target_predict,
):
    """SGLang's verify_tree_greedy contract (its Triton mirror), written out in Python."""
    bs = candidates.shape[0]
    steps = accept_index.shape[1]
    for b in range(bs):
        last = int(retrieve_index[b, 0])
        accept_index[b, 0] = last
        n_acc, cur = 0, 0
        for _ in range(1, steps):
            cur = int(retrieve_next_token[b, cur])
            want = int(target_predict.view(-1)[last])
            found = False
            while cur != -1:
                if int(candidates[b, cur]) == want:
                    predicts[last] = want
                    n_acc += 1
                    accept_index[b, n_acc] = int(retrieve_index[b, cur])
                    last = int(retrieve_index[b, cur])
                    found = True
                    break
                cur = int(retrieve_next_sibling[b, cur])
            if not found:
                break
        accept_token_num[b] = n_acc
        predicts[last] = int(target_predict.view(-1)[last])
    return predicts, accept_index, accept_token_num


def _spine(tree, b):
    """Depth of request b's first-child chain from the root."""
    node, n = 0, 0
    while int(tree.next_token[b, node]) >= 0:
        node, n = int(tree.next_token[b, node]), n + 1
    return n


def _choice_along(tree, b, path_len, wrong=7):
    """Target choices that accept the first ``path_len`` nodes of request b's rank-0 spine."""
    w = tree.width
    choice = torch.full((w,), wrong, dtype=torch.long)
    node = 0
    for _ in range(path_len):
        child = int(tree.next_token[b, node])
        if child < 0:
            break
        choice[node] = tree.tokens[b, child]
        node = child
    choice[node] = 55  # the bonus after the last accepted node
    return choice


def test_root_only_verify_is_causal_no_mask():
    """A width-1 verify (the no-draft round) carries no mask: its one query sees its prefix and
    itself, which is the causal mask; tokens and positions are the root's."""
    seq = torch.tensor([5, 9])
    rr = v.RootRound(2, 3, "cpu")
    tree = rr.tree(torch.tensor([7, 8]), seq)
    vt = v.build_verify_tensors(tree, seq, int(seq.sum()) + 2, masked=False)
    assert vt.custom_mask is None
    assert vt.tokens.tolist() == [7, 8] and vt.positions.tolist() == [5, 9]
    masked = v.build_verify_tensors(tree, seq, int(seq.sum()), masked=True)
    assert masked.custom_mask is not None and bool(masked.custom_mask.all())  # all visible


def test_verify_slots_are_the_draft_blocks_first_columns():
    """Both start at each request's prefix: width <= B reads the block's slots (a view at
    width = B, as DFLASH's verify), a wider verify needs its own lookup (None)."""
    block = torch.arange(2 * 16).view(2, 16) + 100
    same = v.verify_slots(block, 16)
    assert same.data_ptr() == block.data_ptr() and same.tolist() == block.reshape(-1).tolist()
    assert v.verify_slots(block, 5).tolist() == block[:, :5].reshape(-1).tolist()
    assert v.verify_slots(block, 1).tolist() == [100, 116]
    assert v.verify_slots(block, 17) is None
    column = v.verify_slots(block[:, 3:4], 1)  # a no-draft round's step j: column j
    assert column.is_contiguous() and column.tolist() == [103, 119]


@pytest.mark.parametrize("lens", [(0, 0), (1, 3), (3, 2), (2, 0)])
def test_kernel_contract_and_torch_walk_agree(lens):
    tree, _ = _tree()
    lens = tuple(min(n, _spine(tree, b)) for b, n in enumerate(lens))
    assert min(_spine(tree, b) for b in range(2)) >= 2  # deep enough to mean something
    choice = torch.stack([_choice_along(tree, b, n) for b, n in enumerate(lens)])
    a = v.greedy_accept(tree, choice, kernel=None)
    k = v.greedy_accept(tree, choice, kernel=_py_verify_tree_greedy)
    for x, y in zip(a[:5], k[:5], strict=True):  # the acceptance proper
        assert torch.equal(x.long(), y.long())
    # the kernel path also keeps the walk's int32 outputs for the KV compaction
    assert k.index_i32.dtype == torch.int32 and torch.equal(k.index_i32.long(), a.accept_index)
    assert k.len_i32.dtype == torch.int32 and torch.equal(k.len_i32.long(), a.accept_len)
    assert a.index_i32 is None and a.counts is None and k.counts is None  # no CUDA tail here
    assert a.accept_len.tolist() == list(lens)
    assert a.commit_lens.dtype == torch.int32 and a.commit_lens.tolist() == [n + 1 for n in lens]
    assert a.bonus.tolist() == [55, 55]
    w = tree.width
    for b, n in enumerate(lens):
        idx = a.accept_index[b]
        assert int(idx[0]) == b * w  # root first, global index
        assert (idx[n + 1 :] == -1).all()
        nodes = (idx[1 : n + 1] - b * w).tolist()
        assert a.out_tokens[b, :n].tolist() == tree.tokens[b, nodes].tolist()
        assert int(a.out_tokens[b, n]) == 55
        assert (a.out_tokens[b, n + 1 :] == 0).all()


def test_committed_tokens_reads_predicts_at_accepted_nodes():
    predicts = torch.tensor([11, 12, 13, 14, 21, 22, 23, 24])
    accept_index = torch.tensor([[0, 2, -1], [4, 5, 7]])
    out, bonus = v.committed_tokens(predicts, accept_index, torch.tensor([1, 2]))
    assert out.tolist() == [[11, 13, 0], [21, 22, 24]]
    assert bonus.tolist() == [13, 24]


def test_gathered_rows_and_linear_positions_match_the_compacted_kv_layout():
    tree, seq = _tree()
    bs, w = tree.tokens.shape
    hidden = torch.arange(bs * w, dtype=torch.float32).view(-1, 1).repeat(1, 4)
    choice = torch.stack([_choice_along(tree, b, n) for b, n in enumerate((2, 1))])
    acc = v.greedy_accept(tree, choice)
    rows = v.gather_accepted_rows(hidden, acc.accept_index)
    depth1 = tree.max_depth + 1
    assert rows.shape == (bs * depth1, 4)
    for b in range(bs):
        n = int(acc.commit_lens[b])
        want = acc.accept_index[b, :n].tolist()
        assert rows.view(bs, depth1, 4)[b, :n, 0].tolist() == [float(x) for x in want]
    pos = v.linear_positions(seq, depth1)
    assert pos.tolist() == [[int(s) + j for j in range(depth1)] for s in seq]


def test_plan_bound_takes_host_lengths_then_the_reservation():
    """The bound a forward's FlashInfer plan reads: SGLang's host prefix lengths + the width;
    without them (HOST_LENS=bound) the reserved lengths as they are; else None (read back)."""
    host = torch.tensor([3, 4], dtype=torch.int32)
    reserved = torch.tensor([40, 41], dtype=torch.int64)
    bound, total = v.plan_bound(host, reserved, 81, 5)
    assert bound.tolist() == [8, 9] and total == 17 and bound.dtype == torch.int64
    bound, total = v.plan_bound(None, reserved, 81, 5)
    assert bound is reserved and total == 81
    assert v.plan_bound(None, reserved, None, 5)[1] == 81  # the sum from the lengths
    assert v.plan_bound(None, None, None, 5) is None


def test_per_node_targets_greedy_rows_and_filters():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2 * 3, 10, generator=gen)
    # top_k = 1 (how SGLang encodes greedy requests) is the argmax, whatever the temperature
    got = v.per_node_targets(
        logits, 3, torch.tensor([0.7, 1.3]), top_ks=torch.tensor([1, 1]), generator=gen
    )
    assert torch.equal(got, logits.argmax(-1).view(2, 3))
    # a tiny top_p keeps only the most likely token too
    got = v.per_node_targets(
        logits, 3, torch.tensor([1.0, 1.0]), top_ps=torch.tensor([1e-4, 1e-4]), generator=gen
    )
    assert torch.equal(got, logits.argmax(-1).view(2, 3))
    # min_p = 1 keeps only the maximum
    got = v.per_node_targets(
        logits, 3, torch.tensor([1.0, 1.0]), min_ps=torch.tensor([1.0, 1.0]), generator=gen
    )
    assert torch.equal(got, logits.argmax(-1).view(2, 3))


def test_per_node_targets_samples_the_target_distribution():
    gen = torch.Generator().manual_seed(2)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(4000, 1)
    draws = v.per_node_targets(logits, 1, torch.full((4000,), 0.8), generator=gen).view(-1)
    freq = torch.bincount(draws, minlength=4).float() / 4000
    want = torch.softmax(logits[0] / 0.8, -1)
    assert torch.allclose(freq, want, atol=0.03)
    # top_k = 2 renormalises over the two best tokens
    draws = v.per_node_targets(
        logits, 1, torch.ones(4000), top_ks=torch.full((4000,), 2), generator=gen
    ).view(-1)
    freq = torch.bincount(draws, minlength=4).float() / 4000
    want2 = torch.softmax(logits[0, :2], -1)
    assert freq[2:].sum() == 0 and torch.allclose(freq[:2], want2, atol=0.03)


def _torch_top_k_renorm(probs, k):
    """Reference top-k renormalisation with sgl_kernel's calling convention."""
    kth = probs.sort(-1, descending=True).values.gather(1, (k.long() - 1).view(-1, 1))
    kept = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def test_per_node_targets_uses_injected_renorm_kernels():
    calls = []

    def top_k(probs, k):
        calls.append(("k", k.tolist()))
        return _torch_top_k_renorm(probs, k)

    def top_p(probs, p):
        calls.append(("p", p.tolist()))
        return probs

    logits = torch.randn(2 * 3, 10, generator=torch.Generator().manual_seed(3))
    got = v.per_node_targets(
        logits, 3, torch.tensor([1.0, 1.0]), top_ks=torch.tensor([1, 1]),
        top_ps=torch.tensor([0.9, 0.8]), renorm=(top_k, top_p),
    )  # fmt: skip
    assert torch.equal(got, logits.argmax(-1).view(2, 3))
    assert calls[0] == ("k", [1, 1, 1, 1, 1, 1])  # per node, request-major
    assert calls[1][0] == "p" and calls[1][1] == pytest.approx([0.9] * 3 + [0.8] * 3)


def test_pinned_ring_copies_each_round_into_its_own_slot():
    """The padded verify's host-to-device copy: a round's values stay intact while the next
    rounds (up to the ring's size) fill other slots; a longer batch grows the ring."""
    from sglang_dflash.sglang_overlay.verify import PinnedRing

    ring = PinnedRing("cpu", slots=3)
    got = [ring.to_device(torch.tensor([i, i + 1, i + 2])) for i in range(3)]
    for i, t in enumerate(got):
        assert t.tolist() == [i, i + 1, i + 2]  # not overwritten by the later rounds
    big = ring.to_device(torch.arange(100))
    assert big.tolist() == list(range(100)) and big.dtype == torch.int64
    assert ring.to_device(torch.tensor([7])).tolist() == [7]
