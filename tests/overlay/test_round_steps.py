"""A no-draft round runs only the steps some request of the batch still keeps
(``round_steps``), counting the tokens of its round still in flight."""

from __future__ import annotations

from sglang_dflash.sglang_overlay.round_steps import RoundSteps, round_steps


def test_round_steps_is_k_unless_no_request_keeps_that_many():
    assert round_steps(8, [100, 3]) == 8
    assert round_steps(8, [5, 3]) == 5  # the longest-running request keeps 5
    assert round_steps(8, [0, -2]) == 1  # every request has stopped: one step, never zero
    assert round_steps(8, [3, None]) == 8  # no length limit on one of them
    assert round_steps(8, []) == 8


def serve_one(max_new: int, rs: RoundSteps) -> list[int]:
    """One request at bs 1 as SGLang's scheduler runs it: the prefill gives the first token;
    with the overlap schedule a round is launched before the previous one's tokens are
    processed, and rounds are launched until the processed tokens reach ``max_new``. Returns
    each round's steps."""
    seen, steps, in_flight = 0, [], [1]  # the prefill's token
    if not rs.overlap:
        seen, in_flight = 1, []
    while seen < max_new:
        n = rs.plan([("r", seen, max_new)])
        steps.append(n)
        in_flight.append(n)
        if rs.overlap:
            seen += in_flight.pop(0)  # processed after the next round is launched
        else:
            seen += in_flight.pop()
    return steps


def test_a_request_runs_no_round_past_its_last_token():
    """H200 2026-12-05 (absent, bs 1, 256 tokens, k = 8): each request ran 33 rounds of 8
    where 32 hold its tokens: the scheduler launched one more before it saw the request end.
    With the round in flight counted, the last useful round runs what is left and the one the
    scheduler launches late runs a single step."""
    rs = RoundSteps(8)
    steps = serve_one(256, rs)
    assert steps == [8] * 31 + [7, 1] and 1 + sum(steps[:-1]) == 256
    assert rs.trimmed == 2
    # without the overlap schedule the host sees each round at once: only the last is cut
    assert serve_one(256, RoundSteps(8, overlap=False)) == [8] * 31 + [7]


def test_a_tree_round_in_flight_counts_one_token_at_least():
    rs = RoundSteps(8)
    rs.launched([("a", 250, 256)])  # a tree round: commits 1 or more
    assert rs.plan([("a", 250, 256)]) == 5  # 256 - 250 - 1 still to come
    assert rs.plan([("a", 251, 256)]) == 1  # 256 - 251 - 5: it has all it needs
    assert rs.trimmed == 2


def test_the_batch_runs_as_long_as_its_longest_request_needs():
    rs = RoundSteps(8)
    assert rs.plan([("a", 240, 256), ("b", 10, 256)]) == 8
    assert rs.plan([("a", 241, 256), ("b", 11, 256)]) == 8  # b: 237 to come
    assert rs.plan([("a", 249, 256), ("b", 245, 256)]) == 3  # 256 - 245 - 8 for b
    assert rs.plan([("new", 0, 256)]) == 8  # a new request: its prefill's token in flight
    assert rs.trimmed == 1


def test_a_request_with_two_rounds_or_less_to_come_is_not_worth_a_probe():
    """H200 2026-12-05, absent c = 32: the 5 requests of each wave admitted a round late ran
    their last round alone at bs 5, where they counted as new and were probed with a tree of 64
    every wave. A request counts as new only with more than 2 k tokens to come."""
    rs = RoundSteps(8)
    reqs = [("a", 0, 256), ("b", 239, 256), ("c", 240, 256), ("d", 5, None)]
    # in flight: the prefill's token; to come 255, 16, 15, unlimited
    assert rs.worth_probing(reqs) == [True, False, False, True]
    assert rs.plan(reqs) == 8 and rs.worth_probing([("a", 1, 256)]) == [True]  # 247 to come


def test_after_a_prefill_between_rounds_only_the_new_requests_have_tokens_in_flight():
    """SGLang launches the prefill and then processes the last round's results, so by the next
    round the old requests have nothing in flight; the prefill's own requests have its token."""
    rs = RoundSteps(8)
    rs.plan([("a", 230, 256)])  # a round of 8 for "a"
    rs.other_forward()  # a prefill runs between the rounds: a's round is processed meanwhile
    assert rs.plan([("a", 250, 256)]) == 6  # 256 - 250, nothing in flight (not 1: 250 + 8)
    rs.other_forward()
    assert rs.worth_probing([("a", 256, 256), ("b", 0, 256)]) == [False, True]
    assert rs.plan([("b", 0, 256)]) == 8  # b's prefill token in flight: 255 to come
