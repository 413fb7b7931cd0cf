"""The top-K log-prob draft head: single device, capture-safe head, real 2-rank TP (gloo)."""

from __future__ import annotations

import os
import socket

import pytest

torch = pytest.importorskip("torch", reason="the DDTree overlay needs torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from sglang_dflash.ddtree.topk import topk_logprobs  # noqa: E402
from sglang_dflash.sglang_overlay.draft_head import DraftTopKHead, draft_topk  # noqa: E402


def _data(rows=6, hidden=8, vocab=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, hidden, generator=gen), torch.randn(vocab, hidden, generator=gen)


def test_single_device_matches_full_vocab_logprobs():
    hs, w = _data()
    logp, ids = draft_topk(hs, w, 5)
    ref_v, ref_i = topk_logprobs(hs @ w.T, 5)
    assert torch.allclose(logp, ref_v) and torch.equal(ids, ref_i)
    # num_org drops padded vocab rows; vocab_start shifts to global ids
    _, ids2 = draft_topk(hs, torch.cat([w, torch.full((3, 8), 50.0)]), 5, num_org=40)
    assert torch.equal(ids2, ref_i)
    _, ids3 = draft_topk(hs, w, 5, vocab_start=100)
    assert torch.equal(ids3, ref_i + 100)


def test_head_reads_block_positions_one_onward():
    hs, w = _data(rows=2 * 4)  # bs=2, block 4: rows 0 and 4 are the bonus positions
    head = DraftTopKHead(weight=w, block_size=4, k=3, num_org=40, vocab_start=0, max_bs=4)
    head(hs)
    logp, ids = head.read(2)
    assert logp.shape == (2, 3, 3) and ids.shape == (2, 3, 3)
    body = hs.view(2, 4, -1)[:, 1:].reshape(-1, 8)
    ref_v, ref_i = topk_logprobs(body @ w.T, 3)
    assert torch.allclose(logp.reshape(-1, 3), ref_v) and torch.equal(ids.reshape(-1, 3), ref_i)


class _Group:
    """The two calls DraftTopKHead makes on SGLang's GroupCoordinator, over torch.distributed."""

    def __init__(self, world_size):
        self.world_size = world_size

    def all_gather_into_tensor(self, out, inp):
        dist.all_gather_into_tensor(out, inp)


def _rank_main(rank, port, out_path, k):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        hs, w = _data()
        shard = w[rank * 20 : (rank + 1) * 20]
        logp, ids = draft_topk(hs, shard, k, num_org=20, vocab_start=rank * 20, tp_group=_Group(2))
        torch.save((logp, ids), f"{out_path}.{rank}")
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("k", [5, 25])  # 25 > the 20-wide shard: padded shard top-K
def test_two_rank_tp_merge_equals_full_vocab(tmp_path, k):
    out = str(tmp_path / "res")
    try:
        mp.spawn(_rank_main, args=(_free_port(), out, k), nprocs=2, join=True)
    except Exception as exc:  # gloo without all_gather_into_tensor support
        if "all_gather_into_tensor" in str(exc) or "not supported" in str(exc).lower():
            pytest.skip(f"gloo on this torch lacks all_gather_into_tensor: {exc}")
        raise
    hs, w = _data()
    ref_v, ref_i = topk_logprobs(hs @ w.T, k)
    for rank in range(2):
        logp, ids = torch.load(f"{out}.{rank}")
        assert torch.allclose(logp, ref_v, atol=1e-5)
        assert torch.equal(ids, ref_i)  # GLOBAL ids, identical on every rank
