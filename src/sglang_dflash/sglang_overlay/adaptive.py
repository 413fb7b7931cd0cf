"""Adaptive DDTree's device side: per-round counters and timings without a host sync.

Each round leaves, on the GPU, the number of accepted path nodes each smaller budget would have
kept (``path_counts``) and two timing events; ``RoundMeter`` copies the counters into pinned
host memory asynchronously and hands a round to the policy only once its end event has
completed (``Event.query``), a few rounds later. Nothing here waits for the GPU: a round whose
copy is not done stays queued, and the oldest is dropped if the queue is full.
Imports torch only (no SGLang): tested on the CPU with host events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

# the pause rule is the policy's (pure Python); re-exported here for the meter and its tests
from sglang_dflash.sglang_overlay.policy import PAUSE_FACTOR, PAUSE_SLACK_MS, is_pause  # noqa: F401
from sglang_dflash.sglang_overlay.timing import HostEvent  # noqa: F401 (the meter's host clock)


def _path_nodes(accept_index: torch.Tensor, width: int) -> torch.Tensor:
    """The walked path's local node indices ``[bs, L]`` (root dropped, -1 padding) from the
    walk's global ``b*W + i``."""
    bs = accept_index.shape[0]
    base = torch.arange(bs, device=accept_index.device).view(bs, 1) * int(width)
    return torch.where(accept_index >= 0, accept_index.long() - base, -1)[:, 1:]


def path_counts(accept_index: torch.Tensor, width: int, budgets: torch.Tensor) -> torch.Tensor:
    """Sum over the batch of accepted path nodes with local index in 1..n, per budget n.

    ``accept_index`` is the walk's ``[bs, L+1]`` global node index (b*W + i, root first, -1
    padding). Under budget n the tree keeps nodes 1..n (pop order), so a request's accept
    length at n is 1 + its count; the mean over the batch is 1 + sum / bs.
    """
    local = _path_nodes(accept_index, width)
    hit = (local.unsqueeze(-1) >= 1) & (local.unsqueeze(-1) <= budgets.view(1, 1, -1))
    return hit.sum(dim=(0, 1)).to(torch.float32)


def chain_counts(accept_index: torch.Tensor, ranks: torch.Tensor, width: int) -> torch.Tensor:
    """Sum over the batch of the walked path's leading rank-0 nodes: the drafts the rank-0
    chain (DFLASH's block, the chain rung's tree) would have had accepted, shape ``[1]``.

    The drafter's top-K at a depth does not depend on the path (one non-causal block), so the
    chain's node at depth d is the rank-0 node at d wherever it sits in the tree; along the
    walked path the chain goes as far as the path's nodes are rank 0. Exact when the tree
    holds the rank-0 child of the path's last node (or the path is at the deepest level);
    a lower bound otherwise (a tree cut before the chain's next node cannot say whether the
    target would have taken it)."""
    local = _path_nodes(accept_index, width)
    on_chain = (local >= 1) & (ranks.gather(1, local.clamp(min=0)) == 0)
    return on_chain.long().cumprod(1).sum().to(torch.float32).view(1)


@dataclass(frozen=True)
class RoundRecord:
    """One finished round, as the policy reads it."""

    key: int  # padded batch size (the slot)
    ran: int  # budget the round used
    bs: int
    accept_by_budget: dict[int, float]  # mean accept length per budget <= ran
    cost_ms: float | None  # stream time from this round's start to the next one's; None if
    #                        something other than a decode round ran in between


@dataclass
class _Pending:
    key: int
    ran: int
    bs: int
    budgets: tuple[int, ...]
    host: torch.Tensor
    start: object
    end: object
    next_start: object = None


class RoundMeter:
    """Queue of in-flight rounds: ``begin()`` before the round, ``end(...)`` after its commit,
    ``drain()`` returns the rounds whose results have reached the host.
    A start-to-start far beyond the round's own span is a pause (``is_pause``): no cost.

    A round's cost is the stream time from its start event to the **next round's** start
    event, not to its own end: that interval also holds what the scheduler does between rounds
    and the GPU's idle time while the host catches up, which is what a round really costs
    (H200, trained pair: the round's own span was 2.0-2.9 ms while rounds were 3.4-4.8 ms
    apart, docs/real-drafter.md). ``interrupt()`` marks that something else (a prefill) ran
    before the next round: that round then reports no cost.
    """

    def __init__(
        self,
        event_factory: Callable[[], object],
        *,
        pin: bool,
        depth: int = 8,
    ):
        self._event = event_factory
        self._pin = pin
        self._queue: deque[_Pending] = deque()
        self._depth = depth
        self._start = None
        self._open: _Pending | None = None  # ended, waiting for the next round's start
        self.dropped = 0

    def _push(self, p: _Pending) -> None:
        if len(self._queue) >= self._depth:
            self._queue.popleft()
            self.dropped += 1
        self._queue.append(p)

    def begin(self) -> None:
        ev = self._event()
        ev.record()
        if self._open is not None:
            self._open.next_start = ev
            self._push(self._open)
            self._open = None
        self._start = ev

    def interrupt(self) -> None:
        """A non-decode forward runs next: the open round keeps its counters, not its cost."""
        if self._open is not None:
            self._push(self._open)
            self._open = None

    def end(
        self,
        key: int,
        ran: int,
        bs: int,
        budgets: Sequence[int],
        counts: torch.Tensor | None,
    ) -> None:
        """Close this round; ``counts`` is ``path_counts`` for ``budgets`` (None for ran=0)."""
        if self._start is None:
            return
        self.interrupt()  # an end without a begin in between: the earlier round has no cost
        host = torch.empty(len(budgets), dtype=torch.float32, pin_memory=self._pin)
        if counts is not None and len(budgets):
            host.copy_(counts, non_blocking=self._pin)
        ev = self._event()
        ev.record()
        self._open = _Pending(key, ran, bs, tuple(budgets), host, self._start, ev)
        self._start = None

    def drain(self) -> list[RoundRecord]:
        out: list[RoundRecord] = []
        while self._queue:
            p = self._queue[0]
            last = p.next_start if p.next_start is not None else p.end
            query = getattr(last, "query", None)
            if query is not None and not query():
                break
            self._queue.popleft()
            sums = p.host.tolist()
            acc = {n: 1.0 + s / max(1, p.bs) for n, s in zip(p.budgets, sums, strict=True)}
            cost = None
            if p.next_start is not None:
                gap = float(p.start.elapsed_time(p.next_start))
                span = float(p.start.elapsed_time(p.end))
                cost = None if is_pause(gap, span) else gap
            out.append(RoundRecord(p.key, p.ran, p.bs, acc, cost))
        return out
