"""What a planted run must accept: the acceptance of every round, predicted on the CPU.

With a plant file's ``logp_profile`` every planted draft row has the same per-rank log-probs,
so the DDTree (built by the same ``build_tree`` the server uses) has a fixed shape, and the
greedy walk accepts exactly the longest prefix of the planted ranks that is a root path of
that shape. A GPU run's ``spec_verify_ct`` must then equal ``len(expected_rounds(...))``.
"""

from __future__ import annotations

import heapq

import torch

from sglang_dflash.ddtree.tree import build_tree
from sglang_dflash.sglang_overlay.diagnostics.plant import PlantedRequest, profile_row


def accept_len(
    profile: tuple[float, ...], k: int, depth: int, budget: int, ranks: list[int]
) -> int:
    """Drafts accepted in one round whose true token sits at ``ranks[d-1]`` at depth d."""
    logp = torch.tensor(profile_row(profile, k)).expand(1, depth, k).contiguous()
    ids = torch.arange(k).expand(1, depth, k).contiguous()
    tree = build_tree(logp, ids, torch.tensor([k + 1]), torch.tensor([0]), budget)
    tokens, parents = tree.tokens[0].tolist(), tree.parents[0].tolist()
    valid = tree.valid[0].tolist()
    cur, accepted = 0, 0
    for d in range(1, depth + 1):
        r = ranks[d - 1] if d - 1 < len(ranks) else -1
        if not 0 <= r < k:
            break
        nxt = [i for i in range(len(tokens)) if valid[i] and parents[i] == cur and tokens[i] == r]
        if not nxt:
            break
        cur, accepted = nxt[0], accepted + 1
    return accepted


def expected_rounds(
    req: PlantedRequest,
    profile: tuple[float, ...],
    *,
    budget: int,
    block_size: int,
    vocab: int,
    max_new_tokens: int,
) -> list[int]:
    """Accepted drafts per decode round for a greedy request of ``max_new_tokens`` tokens.

    The first token comes from prefill; each round commits accepted + 1 tokens.
    """
    k = min(budget, vocab)
    depth = min(block_size, budget + 1) - 1
    rounds: list[int] = []
    pos, generated = 0, 1
    while generated < max_new_tokens:
        ranks = [
            req.ranks[pos + d] if pos + d < len(req.continuation) else -1
            for d in range(1, depth + 1)
        ]
        a = accept_len(profile, k, depth, budget, ranks)
        rounds.append(a)
        pos += a + 1
        generated += a + 1
    return rounds


def boundary_margin(profile: tuple[float, ...], k: int, depth: int, budget: int) -> float:
    """Score gap between the budget-th best prefix (in the tree) and the next (out of it).

    Paths that are permutations of the same ranks tie exactly under a depth-independent
    profile; when such a tie straddles the budget, which nodes enter the tree is decided by
    tie-breaking and float rounding, which may differ between the GPU and this CPU oracle.
    A margin well above float error (say > 1e-3) makes the prediction exact. Enumerated
    best-first here, independently of ``build_tree``.
    """
    row = profile_row(profile, k)
    heap = [(-row[r], 1) for r in range(k)]
    heapq.heapify(heap)
    scores: list[float] = []
    while heap and len(scores) < budget + 1:
        neg, length = heapq.heappop(heap)
        scores.append(-neg)
        if length < depth:
            for r in range(k):
                heapq.heappush(heap, (neg - row[r], length + 1))
    if len(scores) <= budget:
        return float("inf")
    return scores[budget - 1] - scores[budget]
