"""The adaptive policy on the planted regimes, in the GPU grid's order (absent, branchy, chain
at bs 1, 8, 16), with each round's accept from the CPU plant oracle: where a round starts
depends on the budgets that ran before it, as on the GPU, so a budget estimated only from a
larger tree's rounds is biased (H100 §35: budgets 3 / 7 / 15 held 1.30 at bs 16 on branchy
where they accept 2.0 running, and the slot fell back to no draft)."""

from __future__ import annotations

import collections

import pytest

pytest.importorskip("torch", reason="the plant oracle builds trees with torch")
from sglang_dflash.sglang_overlay.diagnostics.plant_oracle import accept_len
from sglang_dflash.sglang_overlay.policy import AdaptivePolicy, auto_schedule
from tests.conftest import REPO
from tests.script_module import load_script

E2E = load_script(REPO / "scripts" / "gpu_e2e.py", "gpu_e2e_for_policy")
BLOCK = 16
# ms a round by the policy's meter, H100 §35 (padded verify; bs 16 every budget, bs 1 / 8 what
# the slots measured, 3 / 7 at bs 8 a step below 15 where they were only borrowed)
COST = {
    1: {0: 35.44, 3: 6.83, 7: 7.11, 15: 6.9, 31: 7.65, 64: 6.65},
    8: {0: 38.63, 3: 7.4, 7: 7.6, 15: 7.66, 31: 8.82},
    16: {0: 40.29, 3: 9.217, 7: 10.006, 15: 10.749, 31: 12.964},
}
NODRAFT_TOKENS = 8


def phase_table(regime: str, budgets) -> tuple[dict[int, list[int]], int]:
    """Accepted drafts of a round starting at each phase of the regime's rank pattern."""
    pattern = dict(E2E.PLANT_SCHEDULES)[regime]
    out = {}
    for b in budgets:
        depth = min(BLOCK, b + 1) - 1
        out[b] = [accept_len(E2E.PLANT_PROFILE, b, depth, b,
                             [pattern[(ph + d) % len(pattern)] for d in range(1, depth + 1)])
                  for ph in range(len(pattern))]
    return out, len(pattern)


def serve_level(pol, bs, regime, pending, lag=3, waves=6, tokens=256):
    """Waves of ``bs`` requests of ``tokens`` tokens, in step (one plant schedule), fed
    ``lag`` rounds late; tokens a ms over the waves after two of warm-up."""
    cands = pol.schedule.candidates(bs)
    table, period = phase_table(regime, [n for n in cands if n > 0])
    made = spent = 0.0
    for wave in range(waves):
        pos = done = 0
        while done < tokens:
            while len(pending) > lag:
                pol.observe(*pending.popleft())
            n = pol.choose(bs).budget
            step = NODRAFT_TOKENS if n == 0 else 1 + table[n][pos % period]
            acc = {m: 1.0 + table[m][pos % period] for m in cands if 0 < m <= n}
            pos, done = pos + step, done + step
            if wave >= 2:
                made, spent = made + bs * step, spent + COST[bs][n]
            pending.append((bs, n, acc, COST[bs][n]))
    return made / spent


def fixed_rate(bs, regime, n, tokens=256):
    if n == 0:
        return bs * NODRAFT_TOKENS / COST[bs][0]
    table, period = phase_table(regime, [n])
    pos = rounds = 0
    while pos < tokens:
        pos, rounds = pos + 1 + table[n][pos % period], rounds + 1
    return bs * pos / (rounds * COST[bs][n])


def test_in_the_grid_order_each_level_runs_near_its_best_budget():
    pol = AdaptivePolicy(auto_schedule(64), nodraft_tokens=NODRAFT_TOKENS)
    pending: collections.deque = collections.deque()
    ratio = {}
    for regime in ("absent", "branchy", "chain"):
        for bs in (1, 8, 16):
            rate = serve_level(pol, bs, regime, pending)
            best = max(fixed_rate(bs, regime, n) for n in COST[bs])
            ratio[regime, bs] = rate / best
    # branchy at bs 16: budget 3 (2.0 a round in 9.2 ms) beats no draft (8 in 40.3) by 9 %;
    # estimated from budget 31's rounds alone it looked like 1.4 a round (the slot ran no
    # draft: 0.91 x the best) — its own rounds (a trial once the estimate is stale) find it
    assert ratio["branchy", 16] >= 0.95, ratio
    assert all(r >= 0.95 for r in ratio.values()), ratio
    assert all(ratio["absent", bs] >= 0.99 for bs in (1, 8, 16)), ratio
    summary = pol.summary()["16"]
    assert summary["trials"] >= 1, summary
