"""Top-K log-prob head and its tensor-parallel merge (item e)."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch", reason="the DDTree core needs torch")

from sglang_dflash.ddtree.topk import merge_tp_topk, shard_topk, topk_logprobs  # noqa: E402


def _split_points(vocab: int, tp: int, gen: torch.Generator) -> list[int]:
    """Uneven shard boundaries 0 < ... < vocab (every shard non-empty)."""
    cuts = torch.randperm(vocab - 1, generator=gen)[: tp - 1] + 1
    return [0, *sorted(cuts.tolist()), vocab]


def test_topk_logprobs_are_normalised_sorted_log_softmax():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 500, generator=gen) * 3
    logp, ids = topk_logprobs(logits.to(torch.bfloat16), 20)
    assert logp.dtype == torch.float32 and ids.dtype == torch.int64
    assert logp.shape == ids.shape == (7, 20)
    assert torch.all(logp[:, :-1] >= logp[:, 1:])
    full = torch.log_softmax(logits.to(torch.bfloat16).float(), -1)
    torch.testing.assert_close(logp, full.gather(1, ids))
    # the full-vocab normalisation: all K=V values exponentiate to a distribution
    all_lp, _ = topk_logprobs(logits, 500)
    torch.testing.assert_close(all_lp.exp().sum(-1), torch.ones(7))


@pytest.mark.parametrize("tp", [2, 3, 4])
@pytest.mark.parametrize("k", [1, 8, 64])
def test_tp_merge_equals_single_shard_with_global_ids(tp, k):
    gen = torch.Generator().manual_seed(100 * tp + k)
    vocab, rows = 997, 11
    logits = torch.randn(rows, vocab, generator=gen) * 4
    want_lp, want_ids = topk_logprobs(logits, k)
    bounds = _split_points(vocab, tp, gen)
    parts = [shard_topk(logits[:, a:b], k, a) for a, b in itertools.pairwise(bounds)]
    vals = torch.stack([p[0] for p in parts])
    ids = torch.stack([p[1] for p in parts])
    lse = torch.stack([p[2] for p in parts])
    got_lp, got_ids = merge_tp_topk(vals, ids, lse, k)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_lp, want_lp, atol=1e-5, rtol=1e-5)


def test_tp_merge_detects_shard_local_ids():
    """Leaking shard-local ids (vocab_start ignored) must change the merged ids."""
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(5, 400, generator=gen)
    _, want_ids = topk_logprobs(logits, 16)
    bounds = [0, 200, 400]
    leaky = [shard_topk(logits[:, a:b], 16, 0) for a, b in itertools.pairwise(bounds)]
    _, got = merge_tp_topk(
        torch.stack([p[0] for p in leaky]),
        torch.stack([p[1] for p in leaky]),
        torch.stack([p[2] for p in leaky]),
        16,
    )
    assert not torch.equal(got, want_ids)


def test_tp_merge_with_a_shard_narrower_than_k():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 40, generator=gen)
    bounds = [0, 3, 40]  # first shard has 3 < k entries: padded with -inf
    parts = [shard_topk(logits[:, a:b], 10, a) for a, b in itertools.pairwise(bounds)]
    assert parts[0][0].shape == (4, 10) and torch.isneginf(parts[0][0][:, 3:]).all()
    got_lp, got_ids = merge_tp_topk(
        torch.stack([p[0] for p in parts]),
        torch.stack([p[1] for p in parts]),
        torch.stack([p[2] for p in parts]),
        10,
    )
    want_lp, want_ids = topk_logprobs(logits, 10)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_lp, want_lp)
