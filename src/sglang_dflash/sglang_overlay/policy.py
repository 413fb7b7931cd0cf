"""Adaptive DDTree: which node budget each decode round uses. Pure Python, no torch or SGLang.

A round at budget n costs about verify(bs x (n+1)) + draft + tree and earns its accept length;
n = 0 is a round without a draft (a one-node verify: plain decoding, the drafter's KV still
appended). A fixed budget that suits bs = 1 loses to no speculation at bs = 32, and a drafter
that earns nothing makes every round a loss, so the budget is chosen per round:

* The **schedule** lists, per batch-size range, the candidate budgets. Each candidate width has
  its own target CUDA graphs, captured only for the batch sizes whose range lists it (a
  budget a range never uses costs no capture time or memory there).
* For every padded batch size (the CUDA graph that runs) a **slot** keeps an EMA of the accept
  length each candidate *would* have earned and an EMA of each candidate's measured round time.
  Counterfactual accept lengths are exact for every budget up to the one that ran: the tree of
  budget n is the first n nodes of a larger tree (best-first pop order, parents first), so the
  accepted path under n is the part of the walked path with node index <= n.
* Once a budget below the top has rounds of its own, its estimate comes from them alone: the
  counterfactual is exact for the round, but a larger tree starts its rounds elsewhere (after
  the tokens it got through), so it can misjudge what the smaller tree earns running (H100 §35,
  planted branchy at bs 16: 1.30 for budgets 3 / 7 / 15, which accept 2.0 running; the slot ran
  no draft where budget 3 paid). Such an estimate is refreshed by a **trial**, a few rounds of
  that budget in a row, when it is old (``trial_min`` rounds, doubling) or the larger trees'
  counterfactual for it has moved (the traffic changed), and only where the budget could pay
  at the top budget's accept (``_stale``).
* A **change of traffic** shows in the current budget's own rounds: a window of them far off
  its estimate replaces it, sends every other own estimate (the old traffic's) back to the
  larger trees' counterfactuals, and probes (``_follow_shift``; H100 §43: without it a slot
  that met branchy after chain tried each stale budget in turn, 63-67 switches in a level).
* The slot picks the candidate with the most tokens per millisecond. Budgets above the running
  one are unseen, so the slot runs its largest candidate once every ``probe`` rounds; the probe
  interval doubles while probes confirm the choice (the probing overhead falls to <1 %).
* A probe whose own round says a larger budget beats the current choice is **followed up**: the
  slot keeps running its largest candidate, round after round, while the mean of the rounds
  *after* that probe says so (at most ``confirm_max`` rounds). After ``confirm_min`` of them
  their mean, shrunk toward the accept EMAs over every batch size's rounds when it opened
  (weight ``follow_prior`` rounds; the slot's own may be stale), replaces the slot's EMAs if it
  beats the current choice, and the slot switches. One probe moves an EMA by ``alpha`` only, so
  after a long stretch of weak drafts a budget that now earns 3x needed many probes, one per new
  request or per probe interval (H200 §22: the slot at bs 1 stayed on no draft through most of
  the branchy level: accept 3.71 served, where its tree accepted 3.14 a round and a no-draft
  round counts 8; 278 tok/s where the tree's own rounds gave 367). The probe that opens a
  follow-up is not in the mean, and the mean is shrunk, because a follow-up opens *because* a
  round was lucky: where the two choices are close, the lucky round plus three average ones
  switched the slot to a tree that then lost until its EMA decayed (H200 §25, bs 8 on branchy:
  budget 31 earned 2.1 a round in 9.8 ms, no draft 8 in 32.4; 12 switches in ~450 rounds, 0.80 x
  DFLASH).
* A follow-up that ends more than 5 % behind the current choice **backs off**: the slot's next
  weak openings (a probe under ``follow_strong`` x the bar) are waived, 1, 2, 4 … up to 16 of
  them, until a switch (H200 §37: at bs 64 on branchy every wave's probe opened one and none was
  adopted; docs/ddtree.md).
* The EMAs move by ``alpha`` = 0.05 a round: one round's accept length at bs 1 is noisy (a
  geometric number of drafts), and at 0.2 a few bad rounds made a paying tree fall back
  (simulated in tests/overlay/test_policy.py: half the rounds without a draft).

Losslessness does not depend on any of this: every round is verified by the target whatever
its width. ``auto_schedule`` is the default derived from the measured verify cost (a round's
cost is flat up to a few hundred verified tokens and then grows with them: docs/ddtree.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

POLICY_FIXED = "fixed"
POLICY_ADAPTIVE = "adaptive"

# Budgets tried by the automatic schedule (the configured N is always added): 2^k - 1 (verify
# widths of powers of two), and from 47 on a half-octave step between them (1.5 x 2^k - 1):
# past 31 a wider verify is compute-bound at a few requests, so an octave is too coarse a step
# (docs/gpu-results.md §41, H100, planted branchy: with only 31 and 64 at bs 4 the policy sat at
# 1.18 x DFLASH; a 48-wide round accepts what the 65-wide one does for 0.86 x its cost there).
LADDER = (3, 7, 15, 31, 47, 63, 95, 127, 191, 255, 383, 511, 767, 1023)
# Verified tokens per round (bs x (n+1)) above which the automatic schedule stops offering a
# budget at that batch size: the verify forward's cost grows with its tokens beyond a few hundred
# (H200, 8B-shaped Qwen3: docs/ddtree.md "Choosing the budget N").
AUTO_TOKEN_CAP = 512
AUTO_MAX_BS = 1024
# Verify width DFLASH runs at every batch size (the DFlash drafters' block of 16 tokens): the
# automatic schedule offers every budget up to this width at every batch size whatever the token
# cap, so the adaptive policy always has DFLASH's round to choose (docs/gpu-results.md §36: at
# bs 64 the cap left 0 / 3 / 7, and chain c = 64 ran at 0.59 x DFLASH verifying 16 there).
DFLASH_WIDTH = 16
# The chain rung's key among the candidate budgets: a round that drafts the drafter's rank-0
# chain (its whole block, ``chain_tokens`` - 1 drafts) and verifies it causally, as DFLASH does
# — no mask, no tree kernels. A tree of the same width pays for both: at bs 32 a 16-wide tree
# round costs 1.16 x DFLASH's, the custom mask's attention +1.77 ms of GPU (H100 §46), and a
# chain served by that tree read 0.951 x DFLASH. It sorts below every tree budget and is no
# tree's prefix, so what it accepts comes from its own rounds and, as a counterfactual, from
# the walked paths of tree rounds (``adaptive.chain_counts``); summaries and schedules write it
# ``c``.
CHAIN = -1
# Runs of one budget a slot keeps for its summary ("0x37 31x4 0x20": what it ran, in order), so
# a server's policy_state shows how it moved between budgets, not only how often.
RUNS_KEPT = 24


# A round's start-to-next-start beyond PAUSE_FACTOR x its own span + PAUSE_SLACK_MS is a pause,
# not a cost: the server stopped between the two rounds (a profiler writing its trace, a control
# request, a GC pause). On the H200 one such gap put a no-draft round at 869 ms where it costs
# 33, and the policy left the cheapest budget for the rest of the run (docs/gpu-results.md §23).
# Real rounds stay far inside it: start-to-start 1.2-2.2 x the span (the trained pair's 2.0-2.9
# ms spans 3.4-4.8 ms apart; a k = 8 no-draft round 26 ms of GPU in 33-61 ms).
PAUSE_FACTOR = 3.0
PAUSE_SLACK_MS = 50.0


def ema(old: float | None, value: float, alpha: float) -> float:
    """One step of an exponential moving average; the first value starts it."""
    return value if old is None else (1 - alpha) * old + alpha * value


def ema_from_cheapest(old: float | None, value: float, n: int, samples: int,
                      alpha: float) -> float:
    """``ema``, but while ``n`` (this sample's count) is within the first ``samples`` the
    cheapest so far holds: a width's first rounds in a slot carry one-off costs, and an EMA
    seeded by one of them stays too dear for long (H100 §36, §45). Too cheap a start is
    corrected by running; too dear, never."""
    if old is not None and n <= samples:
        return min(old, value)
    return ema(old, value, alpha)


def label(n: int) -> str:
    """A candidate as logs and summaries write it: the budget, or ``c`` for the chain rung."""
    return "c" if n == CHAIN else str(n)


def by_budget(values: dict[int, float], digits: int = 3) -> dict[str, float]:
    """A per-budget map as the summary writes it: keys as strings in budget order, rounded."""
    return {label(n): round(v, digits) for n, v in sorted(values.items())}


def is_pause(gap_ms: float, span_ms: float) -> bool:
    """Whether ``gap_ms`` (start to the next round's start, or the host's time between two
    choices) is a pause rather than a cost, against ``span_ms`` (the round's own span, or
    the wall-time EMA): the meter (adaptive.RoundMeter) and ``observe_wall`` share it."""
    return gap_ms > PAUSE_FACTOR * max(span_ms, 0.0) + PAUSE_SLACK_MS


class PolicyError(ValueError):
    """A policy string or schedule that cannot be served; the message is one line."""


@dataclass(frozen=True)
class Schedule:
    """Candidate budgets per batch-size range: ``((min_bs, (n, ...)), ...)``, min_bs ascending.

    A batch of size bs uses the entry with the largest ``min_bs <= bs``; the first entry must
    start at 1, every candidate list is sorted and unique, and the largest candidate overall is
    the server's budget N (its verify width N+1 is SGLang's ``speculative_num_draft_tokens``).
    """

    entries: tuple[tuple[int, tuple[int, ...]], ...]

    def candidates(self, bs: int) -> tuple[int, ...]:
        chosen = self.entries[0][1]
        for min_bs, cands in self.entries:
            if bs >= min_bs:
                chosen = cands
            else:
                break
        return chosen

    def budgets(self) -> tuple[int, ...]:
        """Every candidate of every range, ascending: one set of verify graphs each."""
        return tuple(sorted({n for _, cands in self.entries for n in cands}))

    @property
    def max_budget(self) -> int:
        return self.budgets()[-1]

    def capture_bs(self, budget: int, graph_bs: Iterable[int]) -> list[int]:
        """The CUDA-graph batch sizes at which ``budget`` can run (those whose range lists it)."""
        return [b for b in sorted(graph_bs) if budget in self.candidates(b)]

    def render(self) -> str:
        """The canonical text form, ``1:0,7,15;8:0,3`` (parse(render(s)) == s)."""
        return ";".join(f"{b}:{','.join(label(n) for n in c)}" for b, c in self.entries)


def validate_entries(
    entries: Sequence[tuple[int, Sequence[int]]], max_budget: int, where: str
) -> Schedule:
    """A Schedule from raw (min_bs, candidates) pairs, or a one-line PolicyError."""
    if not entries:
        raise PolicyError(f"{where}: the schedule is empty")
    out: list[tuple[int, tuple[int, ...]]] = []
    last = 0
    for min_bs, cands in entries:
        if not isinstance(min_bs, int) or min_bs < 1:
            raise PolicyError(f"{where}: batch size {min_bs!r} is not an integer >= 1")
        if min_bs <= last:
            raise PolicyError(f"{where}: batch sizes must ascend; {min_bs} follows {last}")
        last = min_bs
        values = list(cands)
        if not values:
            raise PolicyError(f"{where}: batch size {min_bs} has no candidate budget")
        for n in values:
            if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= max_budget:
                raise PolicyError(
                    f"{where}: budget {n!r} at batch size {min_bs} is outside 0..{max_budget} "
                    "(0 = no draft; the largest is the server's ddtree budget N)"
                )
        out.append((min_bs, tuple(sorted(set(values)))))
    if out[0][0] != 1:
        raise PolicyError(f"{where}: the first range must start at batch size 1, not {out[0][0]}")
    sched = Schedule(tuple(out))
    if sched.max_budget != max_budget:
        raise PolicyError(
            f"{where}: no range lists the server's budget N={max_budget} (largest candidate is "
            f"{sched.max_budget}); lower ddtree.budget to it or list it"
        )
    return sched


def parse_schedule(text: str, max_budget: int, where: str = "schedule") -> Schedule:
    """``"1:0,7,15;8:0,3,7;32:0,3"`` -> Schedule."""
    entries: list[tuple[int, list[int]]] = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        head, sep, tail = part.partition(":")
        if not sep:
            raise PolicyError(f"{where}: {part!r} is not '<batch size>:<budget>,<budget>...'")
        try:
            min_bs = int(head.strip(), 10)
            cands = [int(x.strip(), 10) for x in tail.split(",") if x.strip()]
        except ValueError:
            raise PolicyError(f"{where}: {part!r} holds a non-integer") from None
        entries.append((min_bs, cands))
    return validate_entries(entries, max_budget, where)


def auto_schedule(max_budget: int, token_cap: int = AUTO_TOKEN_CAP) -> Schedule:
    """The default: budgets 0, the ladder below N, and N, each offered where bs x (n+1) fits.

    Every range keeps 0 (no draft) and its smallest positive budget, so a weak drafter or a
    large batch can always fall back, and a strong drafter always has a tree to grow from; and
    a budget as wide as DFLASH's round (``DFLASH_WIDTH``; N where N is narrower), with every
    rung below it, at every batch size: it costs no more memory than DFLASH there.
    """
    if max_budget < 1:
        raise PolicyError(f"auto schedule: budget {max_budget} < 1")
    if token_cap < 2:
        raise PolicyError(f"auto schedule: token cap {token_cap} < 2")
    # ladder steps close to N (63 beside 64) would add graphs for no choice
    ladder = [n for n in LADDER if n <= 0.75 * max_budget] + [max_budget]
    floor = min(max_budget, DFLASH_WIDTH - 1)
    entries: list[tuple[int, tuple[int, ...]]] = []
    bs = 1
    while bs <= AUTO_MAX_BS:
        fit = [n for n in ladder if bs * (n + 1) <= token_cap or n <= floor]
        if max(fit, default=0) < floor:  # N's ladder skips DFLASH's round (N = 16: 15)
            fit.append(floor)
        if bs == 1 and max_budget not in fit:
            fit.append(max_budget)  # the configured N runs at least at bs = 1
        cands = (0, *fit)
        if not entries or entries[-1][1] != cands:
            entries.append((bs, cands))
        bs *= 2
    return Schedule(tuple(entries))


@dataclass(frozen=True)
class PolicySpec:
    """The resolved ``SGLANG_DFLASH_DDTREE_POLICY``: fixed N, or adaptive with a schedule."""

    kind: str
    schedule: Schedule | None = None

    @property
    def adaptive(self) -> bool:
        return self.kind == POLICY_ADAPTIVE

    def describe(self) -> str:
        if not self.adaptive or self.schedule is None:
            return POLICY_FIXED
        return f"{POLICY_ADAPTIVE} {self.schedule.render()}"


def parse_policy(raw: str | None, max_budget: int, env_name: str) -> PolicySpec:
    """``fixed`` (default), ``adaptive`` (auto schedule), ``adaptive:auto:<cap>`` or
    ``adaptive:<schedule>``."""
    text = (raw or "").strip()
    if text in ("", POLICY_FIXED):
        return PolicySpec(POLICY_FIXED)
    head, _, rest = text.partition(":")
    if head != POLICY_ADAPTIVE:
        raise PolicyError(
            f"{env_name}={raw!r}: expected 'fixed', 'adaptive', 'adaptive:auto:<token cap>' or "
            "'adaptive:<min bs>:<budgets>;...'"
        )
    rest = rest.strip()
    if rest in ("", "auto"):
        return PolicySpec(POLICY_ADAPTIVE, auto_schedule(max_budget))
    if rest.startswith("auto:"):
        try:
            cap = int(rest[5:], 10)
        except ValueError:
            raise PolicyError(f"{env_name}={raw!r}: token cap is not an integer") from None
        return PolicySpec(POLICY_ADAPTIVE, auto_schedule(max_budget, cap))
    return PolicySpec(POLICY_ADAPTIVE, parse_schedule(rest, max_budget, env_name))


# ---- the online decision ---------------------------------------------------------------------


@dataclass
class Slot:
    """What one padded batch size has learnt: accept and cost EMAs per candidate budget."""

    candidates: tuple[int, ...]
    current: int  # the budget it runs (no default: -1 is the chain rung, 0 no draft)
    accept: dict[int, float] = field(default_factory=dict)  # tokens per request per round
    cost: dict[int, float] = field(default_factory=dict)  # ms per round
    rounds: int = 0
    since_probe: int = 0
    probe_every: int = 0
    fresh_every: int = 0  # rounds between fresh-request probes while part of the batch is new
    probes_out: int = 0  # regular probes chosen and not yet observed (follow-up rounds are not)
    deferred: bool = False  # the probe now due was deferred off a round after a prefill
    deferrals: int = 0  # probes so deferred (summary: ``probes_deferred``)
    switches: int = 0
    confirm_rounds: int = 0  # rounds probed in a row while confirming (capped at confirm_max)
    confirming: bool = False  # a follow-up is open: its rounds so far say a larger budget wins
    prior: dict[int, float] = field(default_factory=dict)  # accept EMAs when it opened
    streak: dict[int, float] = field(default_factory=dict)  # accept sums of its rounds
    streak_rounds: int = 0
    streak_cost: list[float] = field(default_factory=list)  # ms of its rounds (the top budget)
    follow_ups: dict[str, int] = field(
        default_factory=lambda: {"opened": 0, "adopted": 0, "ended": 0, "capped": 0,
                                 "waived": 0})
    follow_wait: int = 0  # weak openings still to waive after a follow-up ended behind
    follow_backoff: int = 0  # the last wait: doubles with each one ended behind (``_back_off``)
    runs: list[list[int]] = field(default_factory=list)  # recent [budget, rounds] runs
    wall: dict[int, float] = field(default_factory=dict)  # host ms round to round (a check)
    wall_max: dict[int, float] = field(default_factory=dict)  # the longest, pauses included
    wall_n: dict[int, int] = field(default_factory=dict)  # samples in ``wall`` (``observe_wall``)
    stalls: int = 0  # host walls the pause rule left out of the EMA
    # the walls of rounds right after a prefill, apart: under SGLang's overlap schedule such a
    # round's wall also waits out the prefill's forward (``observe_wall``)
    wall_after_prefill: dict[int, float] = field(default_factory=dict)
    # the first such wall of each budget, apart again: at a cold start it is the width's first
    # round too, with its one-off costs (``observe_wall``)
    wall_after_prefill_first: dict[int, float] = field(default_factory=dict)
    warm_from: int = 0  # the padded batch size whose EMAs it started from (0: a cold start)
    borrowed: set[int] = field(default_factory=set)  # budgets whose cost is still borrowed
    own: dict[int, int] = field(default_factory=dict)  # own steady rounds in the accept EMA
    own_at: dict[int, int] = field(default_factory=dict)  # the round of each one's latest
    trial_every: dict[int, int] = field(default_factory=dict)  # staleness that earns a trial
    cf: dict[int, float] = field(default_factory=dict)  # accept EMAs from larger trees' rounds
    cf_ref: dict[int, float] = field(default_factory=dict)  # cf when its own was last sampled
    trial_obs: int | None = None  # the budget whose trial rounds ``observe`` is collecting
    trial_seen: int = 0  # its rounds observed so far
    trial_acc: list[float] = field(default_factory=list)  # their accepts (the first left out)
    trial_cost: list[float] = field(default_factory=list)  # and their costs
    trial: int | None = None  # the budget on trial (None: none; -1 is the chain rung)
    trial_left: int = 0  # its rounds still to choose
    trials: int = 0
    trial_from: int = 0  # the observed round count when the latest trial began
    run_k: int = 0  # steady rounds of the run the latest observed round belongs to
    run_sum: float = 0.0  # their accepts
    shifts: int = 0  # changes of traffic the current budget's rounds showed (``_follow_shift``)
    # own rounds since a test, per budget: (accept, -1 / 0 / +1: below / within / above the
    # budget's estimate by more than ``drift`` when it was observed)
    tail: dict[int, list[tuple[float, int]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Choice:
    budget: int
    probe: bool  # run to refresh the estimates of budgets above the current one


class AdaptivePolicy:
    """Per padded batch size, the budget that earns the most tokens per millisecond.

    ``choose`` is called before a round, ``observe`` when that round's counters have reached
    the host (a few rounds later: no sync). Cold start: the largest candidate runs first (it
    yields counterfactual accept lengths for every smaller one), then each other candidate
    runs until it has a measured cost, then the best runs.
    """

    def __init__(
        self,
        schedule: Schedule,
        *,
        alpha: float = 0.05,
        probe_min: int = 16,
        probe_max: int = 256,
        hysteresis: float = 0.03,
        cost_samples: int = 3,
        fresh_probe: float = 0.25,
        fresh_gap: int = 4,
        nodraft_tokens: int = 1,
        confirm_max: int = 16,
        confirm_min: int = 4,
        follow_prior: float = 4.0,
        follow_strong: float = 2.0,
        follow_lose: float = 0.95,
        follow_backoff_max: int = 16,
        trial_rounds: int = 5,
        trial_min: int = 256,
        trial_max: int = 4096,
        drift: float = 0.5,
        shift_rounds: int = 8,
        bias: float = 1.5,
        chain_tokens: int = DFLASH_WIDTH,
    ):
        self.schedule = schedule
        # the most a chain-rung round commits per request: the drafter's block (``CHAIN``)
        self.chain_tokens = chain_tokens
        # tokens a no-draft round commits per request (its decode steps: the worker's
        # nodraft_steps), known exactly, so budget 0's accept length is not measured
        self.nodraft_tokens = float(nodraft_tokens)
        self.alpha = alpha
        self.probe_min = probe_min
        self.probe_max = probe_max
        self.hysteresis = hysteresis
        self.cost_samples = cost_samples
        self.fresh_probe = fresh_probe
        self.fresh_gap = fresh_gap
        self.confirm_max = confirm_max
        self.confirm_min = confirm_min
        self.follow_prior = follow_prior
        self.follow_strong = follow_strong
        self.follow_lose = follow_lose
        self.follow_backoff_max = follow_backoff_max
        self.trial_rounds = trial_rounds
        self.trial_min = trial_min
        self.trial_max = trial_max
        self.drift = drift
        self.shift_rounds = max(2, shift_rounds)
        self.bias = bias
        self.slots: dict[int, Slot] = {}
        self._cost_seen: dict[tuple[int, int], int] = {}
        # accept EMA per budget over every slot's rounds: a follow-up's prior (``observe``)
        self.pooled: dict[int, float] = {}

    def slot(self, padded_bs: int) -> Slot:
        s = self.slots.get(padded_bs)
        if s is None:
            cands = self.schedule.candidates(padded_bs)
            s = Slot(candidates=cands, current=cands[-1], probe_every=self.probe_min,
                     fresh_every=self.fresh_gap)
            s.accept[0] = self.nodraft_tokens
            self._warm_start(padded_bs, s)
            self.slots[padded_bs] = s
        return s

    def _warm_start(self, padded_bs: int, s: Slot) -> None:
        """A new batch size starts from the nearest one (by ratio) that has measured every
        candidate it has: its accept EMAs (a request's accept does not depend on the batch
        size) and, until this slot measures them, its costs; the best of those runs at once.
        A cold start runs the top budget and then every candidate until each has a cost: on
        the H100 (§26) a bs-28 slot that appeared as a wave of requests arrived ran 13 tree
        rounds at accept 1.0 (host wall 133 / 26 / 23 ms a round at budget 31 / 15 / 7, each
        width's first rounds at that size) on a drafter that earned nothing, where no draft
        had long been measured best at bs 8 and 32."""
        def eligible(other: Slot) -> bool:
            return all(n in other.accept and n in other.cost and n not in other.borrowed
                       for n in s.candidates)

        near = [(abs(math.log(b / padded_bs)), b) for b, o in self.slots.items() if eligible(o)]
        if not near:
            return
        s.warm_from = min(near)[1]
        src = self.slots[s.warm_from]
        s.accept.update({n: src.accept[n] for n in s.candidates})
        s.cost.update({n: src.cost[n] for n in s.candidates})
        # a borrowed accept counts as one own round: counterfactuals do not overwrite it, and
        # this slot's own rounds soon outweigh it
        s.own.update({n: 1 for n in s.candidates if src.own.get(n)})
        s.cf.update({n: v for n, v in src.cf.items() if n in s.candidates})
        s.cf_ref.update({n: v for n, v in src.cf_ref.items() if n in s.candidates})
        s.borrowed = set(s.candidates)
        s.current = max(s.candidates, key=lambda n: self.value(s, n))

    def choose(self, padded_bs: int, fresh: float = 0.0, after_prefill: bool = False) -> Choice:
        """The budget of the next round. ``fresh`` is the share of the batch's requests that
        no top-budget round has seen yet: a slot that fell back learns nothing about them (a
        budget-0 round drafts nothing), so a wholly new batch (every new request at bs 1) is
        probed at once (H200, trained pair: a bs-1 slot sat at budget 0 through a prompt on
        which budget 16 accepted 15 per round), and a batch a quarter new after ``fresh_every``
        rounds, which doubles while probes confirm the choice like the probe interval: with
        requests arriving as others end, a quarter of a bs-8 or bs-32 batch is new every ~8
        rounds, and probing each time cost 3 % of no draft's rate on a weak drafter (§25).

        ``after_prefill``: this round is the first after a prefill. A probe that falls due
        there waits one round: at bs 1 the top budget's round right after a prefill walled
        15-78 ms where the slot's other budgets walled 5-6 ms on that round and the top itself
        6 ms on any other (H100 §40-§41, every regime: ``wall_after_prefill_ms``), and since
        that round's launch holds back the prefill's first token, chain c = 1 lost 10-20 ms of
        each request's ~130 to its first token (0.89-0.90 x DFLASH). Deferred, the new request
        is still probed on its second round; a probe is deferred once only, so a prefill
        before every round (many requests arriving) does not starve the probes."""
        s = self.slot(padded_bs)
        top = s.candidates[-1]
        if top not in s.cost or (top > 0 and len(s.accept) < len(s.candidates)):
            return Choice(top, probe=False)
        for n in reversed(s.candidates if not s.warm_from else ()):  # every candidate's cost
            if self._cost_seen.get((padded_bs, n), 0) < self.cost_samples:
                return Choice(n, probe=False)
        due = (s.since_probe >= s.probe_every
               or (fresh >= 1.0 and s.since_probe >= self.fresh_gap)
               or (fresh >= self.fresh_probe and s.since_probe >= s.fresh_every))
        if s.confirming and s.confirm_rounds >= self.confirm_max:
            s.follow_ups["capped"] += 1  # no adoption within the cap: the evidence is marginal
            self._end_follow_up(s)
        # only a probe that would run now is deferred (and counted): not at the top budget,
        # nor in a follow-up, whose rounds run whatever came before them
        if due and after_prefill and not s.deferred and s.current != top and not s.confirming:
            due, s.deferred = False, True  # once: a prefill before every round must not starve it
            s.deferrals += 1
        elif due:
            s.deferred = False
        if s.current != top and (due or s.confirming):
            # a regular probe may open a follow-up; a follow-up probe counts toward its cap
            s.confirm_rounds = s.confirm_rounds + 1 if s.confirming else 0
            s.probes_out += 0 if s.confirming else 1
            s.since_probe = 0
            s.trial = None  # a probe cuts a trial short: its rounds are dropped (``observe``)
            return Choice(top, probe=True)
        if s.trial is not None:
            if s.trial_left > 0 and s.trial != s.current:
                s.trial_left -= 1
                s.since_probe += 1
                return Choice(s.trial, probe=True)
            s.trial = None
        stale = None if s.confirming else self._stale(s)
        if stale is not None:
            # its rounds are one measurement, applied when the last is observed (``observe``)
            s.trial, s.trial_left = stale, self.trial_rounds - 1
            s.trial_obs, s.trial_seen, s.trial_acc, s.trial_cost = stale, 0, [], []
            s.trials, s.trial_from = s.trials + 1, s.rounds
            s.trial_every[stale] = min(self.trial_max, 2 * self._trial_every(s, stale))
            s.since_probe += 1
            return Choice(stale, probe=True)
        s.since_probe += 1
        return Choice(s.current, probe=False)

    def _trial_round(self, s: Slot, ran: int, steady: bool, accept: dict[int, float],
                     cost_ms: float | None) -> bool:
        """Whether this round is one of a trial's; the last one replaces the budget's own
        estimate with the mean of the trial's rounds after its first (whose start came from
        another budget's rounds). A trial cut short (a round of another budget between its
        rounds: a probe) is dropped whole: its few rounds would otherwise switch the slot
        before the probe's follow-up can judge the top budget (a new request that accepts
        every draft: the trial of 7 won against no draft and ended the follow-up of 15)."""
        m = s.trial_obs
        if m is None:
            return False
        if ran != m:
            if s.trial_seen:
                s.trial_obs = None
            return False
        s.trial_seen += 1
        if steady and s.trial_seen > 1:
            if m in accept:
                s.trial_acc.append(accept[m])
            if cost_ms is not None and cost_ms > 0:
                s.trial_cost.append(cost_ms)
        if s.trial_seen >= self.trial_rounds:
            s.trial_obs = None
            if s.trial_acc:
                s.accept[m] = sum(s.trial_acc) / len(s.trial_acc)
                s.own[m] = len(s.trial_acc)
                if m in s.cf:
                    s.cf_ref[m] = s.cf[m]
            if s.trial_cost:  # its cost too: the EMA may hold a width's first rounds (§36)
                s.cost[m] = sum(s.trial_cost) / len(s.trial_cost)
                s.borrowed.discard(m)
            s.own_at[m] = s.rounds
        return True

    def _trial_every(self, s: Slot, m: int) -> int:
        """Rounds an estimate of budget m may age before a trial; no draft's rounds are long
        (k decode steps), so its trials come a quarter as often."""
        return s.trial_every.get(m, self.trial_min * (4 if m == 0 else 1))

    def _stale(self, s: Slot) -> int | None:
        """The budget below the top whose own accept estimate most needs a trial run, if any.

        A budget the slot does not run keeps the estimate of its own last rounds: the
        counterfactual from a larger tree's round is exact for that round, but a larger tree
        starts its rounds elsewhere (after the tokens it got through), and on the planted
        branchy regime budgets 3 / 7 / 15 accept 1.4 from where budget 31's rounds start and
        2.0 from where their own do (H100 §35, bs 16: the slot fell back to no draft, where
        budget 3 would have paid). So each such budget is run again, a few rounds in a row,
        once its estimate is ``trial_every`` rounds old (doubling from ``trial_min`` after each
        trial, reset by a switch), or at once when the larger trees' counterfactual for it has
        moved by ``drift`` since its own rounds ran (the traffic changed). A budget a shift sent
        back to its counterfactual (``own`` 0) may be tried too, though it has no own estimate:
        left to the counterfactual, which moves by alpha a round, it kept the old traffic's for
        ~30 rounds (H100 §45, D3: a bs-16 slot ran 31 for 29 rounds on chain after branchy where
        15 accepts the same 16 for 0.78 x the cost; replayed 37 -> 24 rounds of 31).
        """
        top = s.candidates[-1]
        if s.trial_obs is not None:
            if s.rounds - s.trial_from < self.trial_rounds + 8:
                return None  # the last trial's rounds are still to be observed
            s.trial_obs = None  # never observed (rounds dropped): given up
        if not s.runs or s.runs[-1][0] != s.current or s.run_k < self.confirm_min:
            return None  # judged against the current budget's latest rounds, not its EMA alone
        # the EMA of a budget just switched to may still be far from it (one probe moves the
        # top's by alpha: a new request that accepts every draft had 15 at 1.8 for 16 a round,
        # and a trial of 7 at 8 a round won against it): the mean of its current run bounds it
        run_mean = s.run_sum / s.run_k
        cost_now = s.cost.get(s.current, 0.0)
        run_value = run_mean / cost_now if cost_now > 0 else -math.inf
        bar = max(self.value(s, s.current), run_value) * (1 + self.hysteresis)
        best, best_score = None, 1.0
        for m in s.candidates:
            # a budget with no own rounds is not tried, unless a shift reset them (``own`` 0)
            if m >= top or m == s.current or (m != 0 and m not in s.own):
                continue
            cost = s.cost.get(m, 0.0)
            if cost <= 0:
                continue
            if m == 0:
                # no draft's accept is exact; its cost is the doubt: tried where that cost
                # divided by ``bias`` would win (§36: 129 ms held for a round that cost ~40)
                if self.nodraft_tokens * self.bias / cost <= bar:
                    continue
            else:
                # a trial that could not pay even at the top budget's accept (here or over
                # every batch size's rounds) is not run (a smaller tree accepts a prefix of the
                # larger one's path): a weak drafter pays for none; nor one whose
                # counterfactual times ``bias`` could not (where rounds start moved 2.0 to 1.4
                # on the plant: a 3 / 7 / 15 that earns 1.0 beside a paying top is none)
                ceiling = max(s.accept.get(top, 1.0), self.pooled.get(top, 1.0),
                              run_mean if s.current == top else 1.0)
                if min(ceiling, self.most_tokens(m),
                       self.bias * s.cf.get(m, math.inf)) / cost <= bar:
                    continue
            score = (s.rounds - s.own_at.get(m, 0)) / self._trial_every(s, m)
            ref, now = s.cf_ref.get(m), s.cf.get(m)
            if ref and now is not None and abs(now - ref) > self.drift * ref:
                score = max(score, 1.0 + abs(now - ref) / ref)
            if score >= best_score:
                best, best_score = m, score
        return best

    def _follow_shift(self, s: Slot, ran: int, done: float) -> None:
        """The traffic changed when every round of a window of ``shift_rounds`` own steady rounds
        of the current budget, whichever budget was current for each (windows not overlapping),
        earned more than ``drift`` away from that budget's accept estimate of the moment, all on
        the same side. A sign test, not a mean's: one request's
        accept at bs 1 is a geometric draw, so a mean of 8 is often 50 % off while all 8 below
        half its mean happen once in 10^3 to 10^4 windows, and no spread estimate is needed (a
        normal test with a geometric's spread could not tell a drop from 16 to 2.7 at bs 1). Then
        each budget's mean over its rounds in the window replaces its estimate, as a trial's
        does; every other budget's own
        estimate, from the old traffic, goes back to what the larger trees' rounds say of it
        (``cf``), to be tried again (``own`` 0: ``_stale``); and the next round probes. Without
        it an own estimate moved only when its budget ran, by ``alpha`` a round, so a slot that
        met new traffic tried each stale budget in turn (H100 §43: chain, then branchy on one
        server — the bs-2 / bs-4 slots with chain's 4 / 8 / 16 / 16 for 3 / 7 / 15 / 31 switched
        63 / 67 times in a level and ran 0.81 / 0.87 x fixed N = 47, where a server that met
        branchy first ran 0.99 / 0.97; replayed in tests/overlay/test_policy_plant.py). The
        current budget only: a follow-up's rounds have their own, shrunk, judgement. A budget's
        window keeps its rounds across its runs until 8 are in: in a cascade each run is 4-7
        rounds, and windows emptied at every switch never filled (replayed: 55 / 45 / 59 / 44
        switches at bs 1 / 2 / 4 / 8, as with no rule at all). Old rounds in a window can only
        delay a shift, not fire one: every round must be off on the same side. The window pools
        the budgets that were current in turn: with the chain rung, the rung and the tree of its
        width are close in value on chain traffic, and on absent traffic their estimates decayed
        by turns, each switching the slot to the other before a window of its own filled (0.74 x
        no draft's rate over the first 100 rounds, 0.92 pooled; the §43 / §45 replays in
        tests/overlay/test_policy_plant.py pass either way: switches at bs 1 / 2 / 4 / 8 in
        branchy after chain 13 / 15 / 17 / 13 -> 8 / 10 / 12 / 14, rates 0.998 / 0.971 / 0.998 /
        0.975 -> 0.999 / 0.971 / 0.998 / 0.967 x the best fixed budget)."""
        old = s.accept.get(ran)
        if old is None:
            return
        side = -1 if done < (1 - self.drift) * old else (1 if done > (1 + self.drift) * old else 0)
        s.tail.setdefault(ran, []).append((done, side))
        window = [side for rounds in s.tail.values() for _, side in rounds]
        if len(window) < self.shift_rounds:
            return
        tails, s.tail = s.tail, {}  # windows do not overlap: one test per window
        if not (all(x == -1 for x in window) or all(x == 1 for x in window)):
            return
        for m, rounds in tails.items():
            s.accept[m] = sum(v for v, _ in rounds) / len(rounds)
            s.own[m], s.own_at[m] = max(s.own.get(m, 0), len(rounds)), s.rounds
        for m in s.candidates:
            if m != 0 and m < s.candidates[-1] and m not in tails and s.own.get(m):
                s.own[m] = 0
                if m in s.cf:
                    s.accept[m] = s.cf[m]
        s.since_probe = max(s.since_probe, s.probe_every)
        s.shifts += 1

    def most_tokens(self, n: int) -> int:
        """The most a round of candidate n commits per request (its drafts and the bonus)."""
        return self.chain_tokens if n == CHAIN else n + 1

    def value(self, s: Slot, n: int) -> float:
        """Expected tokens per ms of budget n; -inf while either EMA is unknown."""
        acc = s.accept.get(n)
        cost = s.cost.get(n)
        if acc is None or cost is None or cost <= 0:
            return -math.inf
        return acc / cost

    def observe(
        self,
        padded_bs: int,
        ran: int,
        accept_by_budget: dict[int, float],
        cost_ms: float | None,
    ) -> int:
        """Fold in one finished round; returns the slot's (possibly new) current budget.

        ``accept_by_budget[n]`` is the mean accept length (committed tokens per request) the
        round's tree would have given at budget n, for candidates n <= ``ran``.
        """
        s = self.slot(padded_bs)
        s.rounds += 1
        # a round after one of the same budget started where that budget's rounds start: its
        # accept is the budget's own (``_stale``); the first of a run started elsewhere
        steady = bool(s.runs) and s.runs[-1][0] == ran
        in_trial = self._trial_round(s, ran, steady, accept_by_budget, cost_ms)
        first_of_trial = in_trial and not steady
        done = self.nodraft_tokens if ran == 0 else accept_by_budget.get(ran, 1.0)
        s.run_k, s.run_sum = (s.run_k + 1, s.run_sum + done) if steady else (0, 0.0)
        if ran == 0 and steady:
            s.own_at[0] = s.rounds  # no draft's cost was just measured in a run of its own
        if steady:
            s.runs[-1][1] += 1
        else:
            s.runs.append([ran, 1])
            del s.runs[:-RUNS_KEPT]
        probed = ran == s.candidates[-1] and s.current != ran  # a probe or a follow-up round
        regular = probed and s.probes_out > 0  # rounds reach here in the order they ran
        if regular:
            s.probes_out -= 1
        if regular and not s.confirming:
            # before this round: a follow-up it opens shrinks toward the freshest estimate of
            # what each budget accepts, the EMA over every batch size's rounds (a request's
            # accept does not depend on the batch it runs in). The slot's own EMA is stale
            # after a change of traffic it ran without drafting through (H100 §32, branchy
            # c = 8 after absent: the bs-8 slot's EMA of budget 31 at 1.0-1.8 while bs 1 had
            # just run 700 rounds of branchy; 7 follow-ups of a tree 11 % ahead, none adopted)
            s.prior = {n: self.pooled.get(n, v) if n != 0 else v for n, v in s.accept.items()}
        a = self.alpha
        top = s.candidates[-1]
        for n, v in accept_by_budget.items():
            if n == top:  # only ever measured by its own rounds (probes, follow-ups, runs)
                s.accept[n] = ema(s.accept.get(n), v, a)
            elif n in s.candidates and n != 0:
                if n == ran and in_trial:
                    pass  # a trial's rounds are applied together (``_trial_round``)
                elif n == ran and steady:
                    k = s.own.get(n, 0) + 1
                    s.own[n], s.own_at[n] = k, s.rounds
                    old = s.accept.get(n) if k > 1 else None  # the first restarts it
                    s.accept[n] = v if old is None else old + max(a, 1 / k) * (v - old)
                    if n in s.cf:
                        s.cf_ref[n] = s.cf[n]
                elif n < ran:
                    s.cf[n] = ema(s.cf.get(n), v, a)
                if not s.own.get(n) and not (n == ran and (steady or in_trial)):
                    s.accept[n] = ema(s.accept.get(n), v, a)
            if n != 0:
                old = self.pooled.get(n)
                self.pooled[n] = ema(old, v, a)
        if steady and ran != 0 and ran == s.current and not in_trial:
            self._follow_shift(s, ran, done)
        # a regular probe's cost is not a sample: one tree round among no-draft rounds costs
        # more than the same round in a run of them (H200 2026-12-05, meter: budget 64 at bs 1
        # 8.2 ms fed by probes, 5.5-6.5 in a run; 31 at bs 8 10.9 against 7.8), and a slot that
        # had fallen back then judged a paying tree by its probes' cost (below, ``_follow_up``)
        # nor is a trial's first round's, the first at its width after rounds at another
        if (cost_ms is not None and cost_ms > 0 and ran in s.candidates and not regular
                and not first_of_trial):
            key = (padded_bs, ran)
            seen = self._cost_seen.get(key, 0)
            self._cost_seen[key] = seen + 1
            if seen >= 1:  # the first round of a width pays one-off costs (H200: 347 ms at N=16)
                old = None if ran in s.borrowed else s.cost.get(ran)  # a borrowed cost goes
                s.borrowed.discard(ran)
                # and the next few may too: the cheapest of them starts the EMA (H100 §36: a
                # bs-16 slot's second no-draft round cost 134 ms, later ones ~40; seeded there,
                # no draft looked 3 x dearer than it was and never ran again: absent at
                # 0.63 x none). Too cheap a start is corrected by running; too dear, never.
                s.cost[ran] = ema_from_cheapest(old, cost_ms, seen, self.cost_samples, a)
        if regular or (probed and s.confirming):
            # a follow-up opens only on a regular probe: rounds of an ended one still in flight
            # reopened it (H100 §26, bs 32 on branchy: 100 follow-ups in 493 rounds, "0x1
            # 15x2" over and over, two thirds of the rounds at a tree that lost to no draft)
            self._follow_up(s, accept_by_budget, ran, None if regular else cost_ms)
        best = max(s.candidates, key=lambda n: self.value(s, n))
        if self.value(s, best) == -math.inf:
            return s.current
        if best != s.current:
            cur_v = self.value(s, s.current)
            if cur_v == -math.inf or self.value(s, best) > cur_v * (1 + self.hysteresis):
                s.current = best
                s.switches += 1
                s.probe_every, s.fresh_every = self.probe_min, self.fresh_gap
                s.probes_out = 0
                s.trial_every = {}
                self._end_follow_up(s)
                s.follow_wait = s.follow_backoff = 0
                return s.current
        # only a regular probe that confirms the choice lengthens the intervals: a follow-up's
        # rounds still in flight when it ended (lag) doubled them 16 -> 256 at once, and a slot
        # that had fallen back then stayed there for 256 rounds
        if regular and best == s.current and not s.confirming:
            s.probe_every = min(self.probe_max, s.probe_every * 2)
            s.fresh_every = min(self.probe_max, s.fresh_every * 2)
        return s.current

    def observe_wall(self, padded_bs: int, ran: int, wall_ms: float,
                     after_prefill: bool = False) -> None:
        """The host's time from one round's choice to the next one's (no prefill between): an
        EMA per budget, reported beside the meter's GPU-event cost and not used to decide.
        Where they differ the meter misses part of a round (H200 §25: at bs 32 the decode log
        showed ~37 ms a round where the meter said 34.7). A gap the meter's rule calls a pause
        (``is_pause`` against the EMA) is not a sample.

        ``after_prefill``: the round is the first after a prefill. Under the overlap schedule
        SGLang launches it, then waits for the prefill's result before it launches the next
        round, so its wall holds the rest of the prefill's forward — the suspect behind the
        probes' 55-77 ms walls (H200 §37: a wave's probe is the round after its prefill; a
        regular probe's cost is not a sample, so the slot's cost for that budget was still the
        one borrowed from bs 1). Kept apart (``wall_after_prefill_ms``), out of the EMA; and a
        budget's first such wall apart from that (``wall_after_prefill_first_ms``): at the slot's
        cold start the top budget's first round comes right after the first request's prefill
        and carries the width's one-off costs, and with probes deferred off that round (``choose``)
        few later samples come to dilute it (H100 §43, bs 1 on chain: the EMA of budget 64 at 139.6
        ms fell by exactly what samples of ~7 ms give, 126.6 / 114.8 / 109.6 after 2 / 2 / 1 more,
        where the other budgets walled 7.3-7.8 after a prefill)."""
        if wall_ms <= 0:
            return
        s = self.slot(padded_bs)
        if after_prefill:
            if ran not in s.wall_after_prefill_first:
                s.wall_after_prefill_first[ran] = wall_ms
            else:
                s.wall_after_prefill[ran] = ema(s.wall_after_prefill.get(ran), wall_ms, self.alpha)
            return
        old = s.wall.get(ran)
        # the longest and the count of pauses, for the summary: a request waiting 0.5 s for
        # its first token (H200 2026-12-05, absent c = 32: TTFT p90 0.53 s against none's
        # 0.16) left no trace in the EMA, which leaves such gaps out
        s.wall_max[ran] = max(s.wall_max.get(ran, 0.0), wall_ms)
        if old is not None and is_pause(wall_ms, old):
            s.stalls += 1
            return
        # the cheapest of a budget's first few walls starts the EMA, as the meter's cost does: a
        # width's first rounds in a slot carry one-off costs (H100 §45: budget 31's first round
        # at bs 2 / 4 walled 92-93 ms on a server compiling the DDTree kernels, its later ones
        # ~7, and the EMA read 47 / 85 ms a level later)
        n = s.wall_n[ran] = s.wall_n.get(ran, 0) + 1
        s.wall[ran] = ema_from_cheapest(old, wall_ms, n, self.cost_samples, self.alpha)

    @staticmethod
    def _end_follow_up(s: Slot) -> None:
        s.confirming, s.confirm_rounds, s.streak, s.streak_rounds = False, 0, {}, 0
        s.streak_cost = []

    def _back_off(self, s: Slot) -> None:
        """A follow-up ended with its rounds behind the current choice by more than a noisy
        dip (under ``follow_lose`` x it): waive the next weak openings, 1, 2, 4 … up to
        ``follow_backoff_max`` of them (``_follow_up``). One that ended on a dip, or was capped,
        backs nothing off: a tree 22 % ahead at bs 8 (H200 2026-12-05, replayed in
        tests/overlay/test_policy.py on 12 seeds) must keep being followed up."""
        s.follow_backoff = min(self.follow_backoff_max, max(1, 2 * s.follow_backoff))
        s.follow_wait = s.follow_backoff

    def _best_rate(self, s: Slot, accept: dict[int, float], ran: int,
                   cost: dict[int, float] | None = None) -> float:
        """Tokens per ms of the best drafting candidate above the current budget under
        ``accept``, at the measured costs (``cost`` overrides some of them). Only those: a
        follow-up asks whether a larger tree wins, and the current budget's own counterfactual
        in a lucky round beats its EMA by chance (H100 §41, chain at bs 4: budget 15 accepts
        the whole block, its EMA sat a little under 16, each probe opened a follow-up on 15's
        own figure and ran 16 rounds of budget 64 at 9.3 ms for what 15 earns in 6.5, capped
        3 times of 4; chain c = 4 and 8 at 0.78-0.98 x DFLASH). And only those with a cost of
        this slot's own, or ``ran`` (the follow-up measures it): one still borrowed from another
        batch size is not this one's (replayed, chain at bs 4 after bs 1: budget 47 at bs 1's
        6.35 ms, 8.0 at bs 4, opened follow-up after follow-up that never measured it).
        The chain rung (``CHAIN``) is above nothing: the EMAs judge it, no follow-up does."""
        costs = s.cost | (cost or {})
        return max((v / costs[n] for n, v in accept.items()
                    if n in s.candidates and n > max(0, s.current) and costs.get(n, 0) > 0
                    and (n not in s.borrowed or n == ran)),
                   default=-math.inf)

    def _follow_up(self, s: Slot, accept_by_budget: dict[int, float], ran: int,
                   cost_ms: float | None) -> None:
        """After a regular probe or a follow-up round while another budget is current. A
        regular probe that says a larger budget wins opens a follow-up (it is not counted: it
        was chosen for its luck); the follow-up runs ``confirm_min`` rounds of its own, then
        ends once their mean does not beat the current choice (no margin: ending at the
        switching margin cut paying follow-ups short), and while it does, their mean
        shrunk toward the pooled accept EMAs it started from (``follow_prior`` rounds of
        weight) replaces the EMAs once that beats the current choice, and the slot switches.
        Its own rounds' mean cost (its first round left out) stands for ``ran``'s cost
        throughout and replaces the EMA on adoption: they
        run the tree round after round, as the slot would after switching, where the EMA may
        hold only costs borrowed or measured long ago (H200 2026-12-05, bs 8 on branchy: the
        follow-ups' rounds cost 7.8 ms, the EMA said 10.9, and 4 of 6 follow-ups ended on a
        tree earning 0.311 a ms against no draft's 0.255)."""
        cur_v = self.value(s, s.current)
        bar = cur_v * (1 + self.hysteresis)
        if cur_v == -math.inf:
            self._end_follow_up(s)
            return
        if not s.confirming:
            rate = self._best_rate(s, accept_by_budget, ran)
            if rate > bar and s.follow_wait > 0 and rate < self.follow_strong * bar:
                # after a follow-up ended behind, a probe that beats the bar by less than
                # ``follow_strong`` x opens none until the back-off is spent (H200 §37, branchy
                # bs 64: a follow-up after every wave's probe, 1.03 x the bar in the replay, 5
                # rounds of a tree earning 0.08 a ms against no draft's 0.2, adopted 0 of 5)
                s.follow_wait -= 1
                s.follow_ups["waived"] += 1
            elif rate > bar:
                s.confirming = True
                s.follow_ups["opened"] += 1
            return
        for n, v in accept_by_budget.items():
            s.streak[n] = s.streak.get(n, 0.0) + v
        s.streak_rounds += 1
        # the follow-up's first round is the first at its width after rounds at another, and
        # pays what such a round pays (H100 §32, bs 8: the host wall of runs three rounds long
        # 13.2-14.6 ms, of budget 31 in long runs 10.5; §27's lone probes 10.95 against 7.82);
        # the rounds after it cost what the slot would pay after switching, and only they stand
        # for the tree's cost
        if cost_ms is not None and cost_ms > 0 and s.streak_rounds > 1:
            s.streak_cost.append(cost_ms)
        own = {ran: sum(s.streak_cost) / len(s.streak_cost)} if s.streak_cost else {}
        k = s.streak_rounds
        if k < self.confirm_min:  # one round says little (H100 §26: ended after one, reopened
            return  # by the next still in flight, a losing tree ran two rounds in three)
        # it ends when its mean does not beat the current choice at all; adopting needs the
        # margin (``bar``). Ending at the margin too cut follow-ups of a tree 11 % ahead: the
        # mean of a few noisy rounds, looked at every round, dips under a 3 % margin often
        # (H100 §32's bs 8 replayed: 3 of 3 follow-ups ended on one seed, no draft in 91 %)
        mean_rate = self._best_rate(s, {n: v / k for n, v in s.streak.items()}, ran, own)
        if mean_rate <= cur_v:
            s.follow_ups["ended"] += 1
            self._end_follow_up(s)
            if mean_rate < self.follow_lose * cur_v:  # behind by more than a noisy dip
                self._back_off(s)
            return
        w = self.follow_prior
        shrunk = {n: (w * s.prior.get(n, v / k) + v) / (w + k) for n, v in s.streak.items()
                  if n in s.candidates and n != 0}
        if self._best_rate(s, shrunk, ran, own) > bar:
            # the EMAs above the current budget are stale (probes update only their accept);
            # the follow-up's own rounds are the fresh estimate: adopt it, so the slot switches
            # (a budget with rounds of its own keeps their estimate: ``_stale``)
            s.accept.update({n: v for n, v in shrunk.items() if n == ran or not s.own.get(n)})
            s.cost.update(own)
            s.borrowed.discard(ran)
            s.follow_ups["adopted"] += 1

    def summary(self) -> dict[str, dict]:
        """Per padded batch size: current budget, EMAs, rounds (for logs and ``check --url``)."""
        return {
            str(bs): {
                "current": s.current,
                "candidates": list(s.candidates),
                "accept": by_budget(s.accept),
                "cost_ms": by_budget(s.cost),
                "wall_ms": by_budget(s.wall),
                "wall_max_ms": by_budget(s.wall_max, 1),
                **({"wall_after_prefill_ms": by_budget(s.wall_after_prefill)}
                   if s.wall_after_prefill else {}),
                **({"wall_after_prefill_first_ms": by_budget(s.wall_after_prefill_first)}
                   if s.wall_after_prefill_first else {}),
                "stalls": s.stalls,
                "rounds": s.rounds,
                "switches": s.switches,
                "follow_ups": dict(s.follow_ups),
                "trials": s.trials,
                **({"shifts": s.shifts} if s.shifts else {}),
                **({"probes_deferred": s.deferrals} if s.deferrals else {}),
                "recent": " ".join(f"{label(n)}x{c}" for n, c in s.runs),
                **({"warm_from": s.warm_from} if s.warm_from else {}),
            }
            for bs, s in sorted(self.slots.items())
        }


def counterfactual_accept(path_nodes: Sequence[int], budgets: Iterable[int]) -> dict[int, int]:
    """Accept length (committed tokens, bonus included) of one walked path under each budget.

    ``path_nodes`` are the local node indices of the accepted path without the root, in walk
    order. A node's ancestors have smaller indices, so budget n keeps exactly the path nodes
    with index <= n, and they form a prefix of the path.
    """
    return {n: 1 + sum(1 for i in path_nodes if 1 <= i <= n) for n in budgets}


def fresh_share(rids: Sequence[object], seen: set,
                counts: Sequence[bool] | None = None) -> float:
    """Share of ``rids`` not in ``seen`` (0.0 for an empty batch); with ``counts``, only the
    requests it marks count as new: a request about to finish is not worth a probe (H200
    2026-12-05, absent c = 32: the last 5 requests of each wave, admitted a round late and never
    probed at bs 32, ran their final round alone at bs 5 and were probed there with a tree of
    64 every wave)."""
    if not rids:
        return 0.0
    marks = counts if counts is not None else [True] * len(rids)
    return sum(1 for r, c in zip(rids, marks, strict=True) if c and r not in seen) / len(rids)
