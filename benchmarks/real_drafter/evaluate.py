"""Offline accept length: simulated greedy speculative decoding on held-out prompts.

Per prompt the target's greedy continuation ``Y`` is fixed (greedy verify commits exactly the
target's greedy tokens), so a round needs no target forward: with S tokens committed, the
block is [Y[S], MASK...] (Y[S] = the bonus token of the previous round, or the prefill's),
the drafter sees the target features of Y[:S], and

* linear DFlash accepts the longest prefix of the argmax chain equal to Y[S+1..]
  (SGLang's ``compute_dflash_correct_drafts_and_bonus``);
* DDTree builds the project's tree (``sglang_dflash.ddtree.tree.build_tree``, top-K = N, on
  the CPU) and walks it (``walk.greedy_walk``) with the target's choice at each node: on the
  greedy path the choice at depth d is Y[S+d+1]; off it no node can be accepted anyway.

Then ``accept + 1`` tokens are committed and the next round starts after them, so the rounds
are the ones a server sees. A request stops once it has ``new_tokens`` output tokens (the
prefill's token counts one), like SGLang's ``max_new_tokens`` with ``ignore_eos``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_dflash.ddtree.topk import topk_logprobs
from sglang_dflash.ddtree.tree import build_tree
from sglang_dflash.ddtree.walk import greedy_walk

from .common import Phase
from .drafter import DFlashDrafter, draft_logits


@dataclass(frozen=True)
class ModeResult:
    """One decoding mode over all prompts."""

    mode: str  # "dflash" or "ddtree-N"
    rounds: int
    committed: int  # sum over rounds of accept + 1
    accept_length: float  # committed / rounds: tokens per verify round, bonus included
    served_formula: float  # sum(new_tokens) / rounds: SGLang's completion_tokens / verify_ct
    served_formula_per_request: float  # the same, averaged over requests
    accepted_drafts_histogram: list[int]  # rounds by accepted draft count 0..L-1
    rounds_per_request: list[int]
    stopped_early: bool


def linear_accept(logits: torch.Tensor, y_next: torch.Tensor) -> torch.Tensor:
    """Accepted drafts of the argmax chain: logits ``[n, L-1, V]``, ``y_next`` = Y[S+1..S+L-1]."""
    chain = logits.argmax(-1)
    return (chain == y_next).to(torch.int64).cumprod(1).sum(1)


def tree_accept(logits: torch.Tensor, bonus: torch.Tensor, seq_lens: torch.Tensor,
                y_path: torch.Tensor, budget: int) -> torch.Tensor:
    """Accepted drafts of the DDTree of ``budget`` nodes; ``y_path`` ``[n, L+1]`` = Y[S..S+L]
    (the target's greedy choice at depth d is ``y_path[:, d+1]``)."""
    k = min(budget, logits.shape[-1])
    n, depth, vocab = logits.shape
    logp, ids = topk_logprobs(logits.reshape(n * depth, vocab), k)
    logp, ids = logp.view(n, depth, k).cpu(), ids.view(n, depth, k).cpu()
    tree = build_tree(logp, ids, bonus.cpu(), seq_lens.cpu(), budget)
    pred = y_path.cpu().gather(1, (tree.depths + 1).clamp(max=y_path.shape[1] - 1))
    return greedy_walk(tree, pred).accept_len


@torch.no_grad()
def simulate(drafter: DFlashDrafter, embed_w, feats, seqs, prompt_lens, new_tokens: int,
             mask_id: int, mode: str, budget: int | None, phase: Phase) -> ModeResult:
    """One mode over a batch: ``seqs`` [n, T] = prompt + greedy continuation (right-padded),
    ``feats`` its target features, ``prompt_lens`` [n]."""
    n, t = seqs.shape
    dev = seqs.device
    block = drafter.d.block_size
    pos = torch.arange(t, device=dev).expand(n, t)
    ctx_kv = drafter.context_kv(feats, pos)
    s = prompt_lens.clone().to(dev)
    rounds = torch.zeros(n, dtype=torch.long)
    hist = torch.zeros(block, dtype=torch.long)
    committed = 0
    while True:
        active = (s - prompt_lens.to(dev) + 1) < new_tokens
        if not bool(active.any()) or phase.over():
            break
        rows = active.nonzero().squeeze(1)
        kv = [(k[rows], v[rows]) for k, v in ctx_kv]
        anchors = s[rows].unsqueeze(1)
        logits = draft_logits(drafter, embed_w, kv, seqs[rows], anchors, mask_id)[:, 0].float()
        path_idx = anchors + torch.arange(block + 1, device=dev)
        assert int(path_idx.max()) < t, "continuation too short for the lookahead"
        y_path = seqs[rows].gather(1, path_idx)  # Y[S .. S+L]
        if mode == "dflash":
            acc = linear_accept(logits, y_path[:, 1:block])
        else:
            acc = tree_accept(logits, y_path[:, 0], s[rows], y_path, int(budget))
        acc = acc.to(dev)
        s[rows] += acc + 1
        rounds[rows.cpu()] += 1
        hist += torch.bincount(acc.cpu(), minlength=block)[:block]
        committed += int((acc + 1).sum())
    total_rounds = int(rounds.sum())
    per_req = [new_tokens / int(r) for r in rounds if int(r) > 0]
    return ModeResult(
        mode=mode, rounds=total_rounds, committed=committed,
        accept_length=committed / max(1, total_rounds),
        served_formula=new_tokens * n / max(1, total_rounds),
        served_formula_per_request=sum(per_req) / max(1, len(per_req)),
        accepted_drafts_histogram=hist.tolist(), rounds_per_request=rounds.tolist(),
        stopped_early=phase.stopped_early,
    )


def merge(parts: list[ModeResult], new_tokens: int, n_prompts: int) -> ModeResult:
    """Combine the results of several prompt batches of one mode."""
    rounds = sum(p.rounds for p in parts)
    committed = sum(p.committed for p in parts)
    hist = [sum(col) for col in zip(*(p.accepted_drafts_histogram for p in parts), strict=True)]
    per_request = [r for p in parts for r in p.rounds_per_request]
    per_req = [new_tokens / r for r in per_request if r > 0]
    return ModeResult(
        mode=parts[0].mode, rounds=rounds, committed=committed,
        accept_length=committed / max(1, rounds),
        served_formula=new_tokens * n_prompts / max(1, rounds),
        served_formula_per_request=sum(per_req) / max(1, len(per_req)),
        accepted_drafts_histogram=hist, rounds_per_request=per_request,
        stopped_early=any(p.stopped_early for p in parts),
    )
