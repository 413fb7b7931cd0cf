"""Greedy walk against the heap reference and an SGLang verify_tree_greedy mirror."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="the DDTree core needs torch")

from sglang_dflash.ddtree.reference import build_tree_reference, follow_reference  # noqa: E402
from sglang_dflash.ddtree.tree import build_tree  # noqa: E402
from sglang_dflash.ddtree.walk import greedy_walk  # noqa: E402

from .test_tree import make_inputs  # noqa: E402


def verify_tree_greedy_mirror(candidates, retrieve_index, next_token, next_sibling, predict,
                              num_spec_tokens):
    """Python transcription of sgl_kernel's verify_tree_greedy loop (one request): scan the
    LCRS children of the last accepted node for target_predict[last accepted]."""
    accept = [int(retrieve_index[0])]
    last, cur = int(retrieve_index[0]), 0
    for _ in range(1, num_spec_tokens):
        cur = int(next_token[cur])
        while cur != -1:
            if int(candidates[cur]) == int(predict[last]):
                last = int(retrieve_index[cur])
                accept.append(last)
                break
            cur = int(next_sibling[cur])
        if cur == -1:
            break
    return accept


def path_biased_predictions(tree, gen, p_follow=0.8):
    """Target choices that follow a random child with prob p_follow, else a fresh token."""
    bs, width = tree.tokens.shape
    pred = torch.randint(0, 50, (bs, width), generator=gen)
    for b in range(bs):
        for i in range(width):
            kids = [c for c in range(width) if int(tree.parents[b, c]) == i]
            if kids and torch.rand(1, generator=gen).item() < p_follow:
                pick = kids[int(torch.randint(0, len(kids), (1,), generator=gen))]
                pred[b, i] = tree.tokens[b, pick]
    return pred


@pytest.mark.parametrize("seed", range(12))
def test_greedy_walk_matches_reference_and_sglang_semantics(seed):
    gen = torch.Generator().manual_seed(seed)
    bs, depth, k, n = 3, 6, 5, [1, 7, 30][seed % 3]
    logp, ids, roots, seq_lens = make_inputs(seed, bs, depth, k, ["smooth", "ties"][seed % 2])
    tree = build_tree(logp, ids, roots, seq_lens, n)
    pred = path_biased_predictions(tree, gen)
    res = greedy_walk(tree, pred)
    width = tree.width
    flat_pred = pred.reshape(-1)
    for b in range(bs):
        ref = build_tree_reference(
            logp[b].tolist(), ids[b].tolist(), int(roots[b]), int(seq_lens[b]), n
        )
        path, committed = follow_reference(ref, pred[b, : len(ref.tokens)].tolist())
        mirror = verify_tree_greedy_mirror(
            tree.tokens[b], tree.retrieve_index[b], tree.next_token[b], tree.next_sibling[b],
            flat_pred, depth + 1,
        )
        acc = int(res.accept_len[b])
        assert acc == len(path) - 1
        assert res.accept_index[b, : acc + 1].tolist() == [b * width + i for i in path]
        assert res.accept_index[b, : acc + 1].tolist() == mirror
        assert torch.all(res.accept_index[b, acc + 1 :] == -1)
        assert res.out_tokens[b, : acc + 1].tolist() == committed
        assert int(res.bonus[b]) == committed[-1]
        assert int(res.commit_lens[b]) == acc + 1


def test_full_depth_acceptance_commits_bonus_last():
    logp = torch.zeros(1, 3, 1)
    ids = torch.tensor([[[5], [6], [7]]])
    tree = build_tree(logp, ids, torch.tensor([9]), torch.tensor([0]), 3)
    pred = torch.tensor([[5, 6, 7, 8]])  # every draft accepted, bonus 8 at the leaf
    res = greedy_walk(tree, pred)
    accept_index, accept_len, out_tokens, commit_lens = res  # the documented 4-tuple
    assert commit_lens.tolist() == [4] and int(res.bonus[0]) == 8
    assert accept_len.tolist() == [3]
    assert out_tokens.tolist() == [[5, 6, 7, 8]]
    assert accept_index.tolist() == [[0, 1, 2, 3]]


@pytest.mark.parametrize("seed", range(6))
def test_duplicate_sibling_tokens_follow_the_kernel_scan_order(seed):
    """Trees from other builders may repeat a token among siblings; the kernel takes the
    first in link order, and so must the walk."""
    gen = torch.Generator().manual_seed(seed)
    logp, ids, roots, seq_lens = make_inputs(seed, 4, 4, 4, "smooth")
    tree = build_tree(logp, ids, roots, seq_lens, 20)
    tree = dataclasses.replace(tree, tokens=torch.where(tree.valid, tree.tokens % 2, 0))
    pred = torch.randint(0, 2, tree.tokens.shape, generator=gen)
    res = greedy_walk(tree, pred)
    for b in range(4):
        mirror = verify_tree_greedy_mirror(
            tree.tokens[b], tree.retrieve_index[b], tree.next_token[b], tree.next_sibling[b],
            pred.reshape(-1), 5,
        )
        assert res.accept_index[b, : len(mirror)].tolist() == mirror
        assert int(res.accept_len[b]) == len(mirror) - 1
