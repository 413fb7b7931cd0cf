"""Per-request Python heap DDTree (the liranringel/ddtree reference design).

The oracle for the batched builder and the baseline for the benchmark: ``heapq`` entries
``(-score, depth, parent, rank, score)``, one pop per node, O(N^2) visibility rows, LCRS links
from the child lists. liranringel/ddtree's entries are ``(-score, rank_tuple, ...)``; the
``(depth, parent pop index, rank)`` tie-break pops the same nodes unless two scores are
bit-identical, and is the rule the batched builder implements. Scores are rounded to float32
after every addition so they equal the float32 sums the batched builder computes (IEEE
addition, same order), which makes exact comparison possible even on ties.
"""

from __future__ import annotations

import heapq
import math
import struct
from dataclasses import dataclass


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


@dataclass(frozen=True)
class RefTree:
    """One request's tree as plain lists, node 0 = root, nodes in pop order."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    ranks: list[int]
    scores: list[float]
    visibility: list[list[bool]]
    next_token: list[int]
    next_sibling: list[int]
    positions: list[int]


def build_tree_reference(
    logp: list[list[float]],
    ids: list[list[int]],
    root_token: int,
    seq_len: int,
    budget: int,
    f32: bool = True,
) -> RefTree:
    """Best-first heap over per-depth top-K log-probs ``logp[L][K]`` (rows sorted desc)."""
    rnd = _f32 if f32 else float
    depth_max = len(logp)
    k = len(logp[0]) if depth_max else 0
    tokens, parents, depths, ranks, scores = [root_token], [-1], [0], [0], [0.0]
    heap: list = []

    def push(parent: int, depth: int, rank: int) -> None:
        s = rnd(scores[parent] + logp[depth - 1][rank])
        if s != -math.inf:
            heapq.heappush(heap, (-s, depth, parent, rank, s))

    if depth_max and k:
        push(0, 1, 0)
    while heap and len(tokens) <= budget:
        _, depth, parent, rank, s = heapq.heappop(heap)
        tokens.append(ids[depth - 1][rank])
        parents.append(parent)
        depths.append(depth)
        ranks.append(rank)
        scores.append(s)
        node = len(tokens) - 1
        if rank + 1 < k:
            push(parent, depth, rank + 1)
        if depth < depth_max:
            push(node, depth + 1, 0)

    n = len(tokens)
    vis = [[False] * n for _ in range(n)]
    vis[0][0] = True
    for i in range(1, n):
        vis[i] = list(vis[parents[i]])
        vis[i][i] = True
    next_token, next_sibling, last_child = [-1] * n, [-1] * n, [-1] * n
    for i in range(1, n):
        p = parents[i]
        if last_child[p] < 0:
            next_token[p] = i
        else:
            next_sibling[last_child[p]] = i
        last_child[p] = i
    return RefTree(
        tokens=tokens,
        parents=parents,
        depths=depths,
        ranks=ranks,
        scores=scores,
        visibility=vis,
        next_token=next_token,
        next_sibling=next_sibling,
        positions=[seq_len + d for d in depths],
    )


def follow_reference(tree: RefTree, posterior: list[int]) -> tuple[list[int], list[int]]:
    """Reference walk: from the root, move to the child whose token equals posterior[cur].

    Returns (accepted node indices root first, committed tokens = posterior at each).
    """
    children: dict[int, dict[int, int]] = {}
    for i in range(1, len(tree.tokens)):
        children.setdefault(tree.parents[i], {})[tree.tokens[i]] = i
    cur, path = 0, [0]
    while posterior[cur] in children.get(cur, {}):
        cur = children[cur][posterior[cur]]
        path.append(cur)
    return path, [posterior[i] for i in path]
