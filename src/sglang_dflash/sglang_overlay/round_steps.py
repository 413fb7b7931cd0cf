"""How many decode steps a no-draft round runs: k, or fewer when no request can use k.

A request stops at its ``max_new_tokens``. A k-step round in which every request stops sooner
runs steps whose tokens nobody keeps, and under SGLang's overlap schedule the scheduler learns
that a request has finished one round late, so it launches one more round for it. At bs 1 on
the H200 (2026-12-05, absent regime, 256-token requests) every request ran 33 no-draft rounds
of 8 steps where 32 hold its tokens: a whole 28.8 ms round a request, 3 % of it, and at the end
of a wave of requests that all stop together the same at every batch size.

Pure bookkeeping (no torch): the worker passes each request's id, output length and
``max_new_tokens`` before a round; the output length the host sees lags by the round still in
flight, whose tokens are known exactly for a no-draft round (its steps) and at least 1 for a
tree round or a prefill. Stops the host cannot foresee (EOS, stop strings) are not counted: a
round is only ever shortened to steps some request can still keep, never below 1.
"""

from __future__ import annotations

from collections.abc import Sequence

# (request id, output tokens the host has seen, max_new_tokens or None)
ReqLengths = tuple[object, int, "int | None"]


def round_steps(k: int, left: Sequence[int | None]) -> int:
    """Steps of a no-draft round: ``k``, or the most any request can still keep (at least 1).
    ``left`` holds each request's tokens still to come (None: no length limit)."""
    if not left or any(n is None for n in left):
        return k
    return max(1, min(k, max(left)))


class RoundSteps:
    """The tokens each request of the batch still has to come, counting its round in flight.

    Under SGLang's overlap schedule the scheduler launches a round and only then processes the
    results of the one before it (``Req.output_ids`` grows then), so while a round is planned
    the request's previous round — or its prefill, one token — is still in flight. ``plan`` (a
    no-draft round) and ``launched`` (a tree round: at least one token a request) record what
    each request's round commits for the next call. Without the overlap schedule nothing is in
    flight. A guess that is off only moves where the round is cut, never what it computes."""

    def __init__(self, k: int, overlap: bool = True) -> None:
        self.k = k
        self.overlap = overlap
        self._last: dict[object, int] = {}  # rid -> tokens its last round commits (at least)
        self.trimmed = 0  # rounds run shorter than k

    def _left(self, reqs: Sequence[ReqLengths]) -> list[int | None]:
        out: list[int | None] = []
        for rid, seen, max_new in reqs:
            if max_new is None:
                out.append(None)
                continue
            in_flight = self._last.get(rid, 1) if self.overlap else 0  # 1: the prefill's
            out.append(max_new - seen - in_flight)
        return out

    def _record(self, reqs: Sequence[ReqLengths], commits: int) -> None:
        self._last = {rid: commits for rid, _, _ in reqs}

    def worth_probing(self, reqs: Sequence[ReqLengths]) -> list[bool]:
        """Per request: more than two full no-draft rounds of tokens still to come (or no
        length limit). A probe measures what a tree would earn on the request's next rounds;
        one with a round or two left has none worth a probe."""
        return [n is None or n > 2 * self.k for n in self._left(reqs)]

    def plan(self, reqs: Sequence[ReqLengths]) -> int:
        """Steps for a no-draft round over ``reqs``; records the round as launched."""
        steps = round_steps(self.k, self._left(reqs))
        self.trimmed += steps < self.k
        self._record(reqs, steps)
        return steps

    def launched(self, reqs: Sequence[ReqLengths]) -> None:
        """A tree round over ``reqs``: it commits at least one token a request."""
        self._record(reqs, 1)

    def other_forward(self) -> None:
        """A prefill (or idle) forward runs between two rounds: SGLang processes the last
        round's results after launching it, so by the next round nothing of the last round is
        in flight (a request the prefill admits still has its first token in flight)."""
        self._last = dict.fromkeys(self._last, 0)
