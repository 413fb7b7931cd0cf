"""Adaptive grid (issue 14 item 4): output tok/s and accept length of every speculation mode on
planted acceptance regimes at c = 1 ... 64, dummy weights, 256-token greedy outputs.

Runs ON the GPU host (no network; the staged site dir first on PYTHONPATH), from the repo root:

    PYTHONPATH=/root/site:src:benchmarks python3 -m adaptive_grid --out /root/grid \\
        --time-budget-s 540

Flow (docs/ddtree.md "Adaptive grid: the command"): write 4B- (or 8B-) shaped dummy target and
draft configs under --out/models; per regime --prompts-per-regime random-id prompts (seeded,
distinct across regimes: the plant is keyed by prompt ids). Phase ``none`` first: a
no-speculation server takes the greedy continuations of every prompt (256 + 16 + 1 tokens,
kept in --out/continuations.json) and benches each level over all prompts (none's speed does not
depend on the regime; its cells are shared across regimes). From the continuations and each
regime's rank pattern (scripts/gpu_e2e.py PLANT_SCHEDULES) it writes --out/plant.json. Then
``dflash``: stock DFLASH, one server per regime with SGLANG_SIMULATE_ACC_LEN = the regime's
linear-chain accept length (what DFLASH gets from the same drafter); then one server per DDTree
mode (``ddtree-<N>`` fixed, ``ddtree-adaptive``) with the plant, benching each regime's
prompts at each level, and after each regime ``check --url`` (and, for adaptive, the policy
summary from /server_info).

Resumable and time-bounded: --out/results.json is rewritten after every bench; cells already
there are skipped. Estimates come from what was measured (Grid.level_estimate,
Grid.start_estimate: per-round work scaled by accept length and measured cost ratios, the
median warm start). A server whose estimate (start + its levels; a DDTree server: + its first
pending regime) does not fit --time-budget-s is skipped with the reason recorded; a started
DDTree server runs each regime, and every server each level, only if its estimate fits the
time left, leaving the rest (recorded) for the next call, so back-to-back calls with the same
--out finish the grid. SIGINT or SIGTERM (``timeout -s INT 545 python3 -m adaptive_grid
...``) stops the running server, saves results.json, writes --export, and exits 130 (143)
with one line. The grid (--grid-json) is rewritten too. ``--plot GRID_JSON PNG`` draws it
(matplotlib, on any machine afterwards).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import importlib.metadata
import json
import os
import platform
import random
import shlex
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import gpu_e2e as e2e  # scripts/ is not a package

from sglang_dflash import portowner
from sglang_dflash.sglang_overlay import policy as overlay_policy
from sglang_dflash.sglang_overlay import settings as overlay_settings

NEW_TOKENS = 256
BLOCK = e2e.BLOCK  # the draft's block size: 15 drafts + the bonus per round at most
CONT_TOKENS = NEW_TOKENS + BLOCK + 1  # every depth drafted in the last round is planted
LEVELS = (1, 2, 4, 8, 16, 32, 64)
REGIMES = ("absent", "branchy", "chain")
MODES = ("none", "dflash", "ddtree-8", "ddtree-16", "ddtree-64", "ddtree-adaptive")
SCHEDULES = dict(e2e.PLANT_SCHEDULES)
MIN_REQUESTS_PER_LEVEL = 4
PROMPT_LEN = (64, 512)
CONTEXT_LENGTH = 2048
# Time estimates, calibrated on the H200 run of 2026-12-03 (docs/gpu-runs/2026-12-03): a check
# plus a server's stop took ~7 s, three regimes' checks and identity runs plus a stop ~20 s.
CHECK_ESTIMATE_S = 4.0
IDENTITY_SEQUENTIAL = 2  # prompts of a regime also run one at a time (batch size 1)
IDENTITY_ESTIMATE_S = 4.0
BENCH_OVERHEAD_S = 1.5  # a bench process's start: a level takes this + rounds x round time
STOP_S = 8.0  # a server's stop, after its last level
ADAPTIVE_EXTRA_S = 30.0  # an adaptive server captures graphs for several widths (H200: +35 s)
COLD_FACTOR = 1.5  # a run's first start this much slower than the warm ones was a cold machine
TOKEN_CAP = 512  # verified tokens per round above which a round's cost grows (docs/ddtree.md)
# A DDTree round against a DFLASH round at the same c, before any DDTree level is measured
# (H200 2026-12-03: fixed budgets 8-64 took 1.2-1.6x DFLASH's round, adaptive 0.5-1.4x).
DDTREE_ROUND = 1.4
ADAPTIVE_ROUND = 1.2
CONTINUATIONS_ESTIMATE_S = 30.0
TARGET_VS_BEST = 0.95  # adaptive / max(none, dflash) at every (regime, c)
TARGET_BRANCHY = 1.3  # adaptive / dflash on branchy at c <= 8
BRANCHY_MAX_C = 8
POLICY_CHECK = "ddtree_policy"

# Qwen3-4B's config.json fields; the rest (and the 8B shape) are gpu_e2e's.
SHAPE_4B = {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 151936, "tie_word_embeddings": True}
SHAPES = ("4b", "8b")



TIMELINE_FIELDS = ("start", "ttft", "latency", "output_tokens")


def request_timeline(records: list[dict]) -> dict:
    """Each request's start, time to first token, latency (s, ms precision) and tokens, in
    start order: what the dropped per-request records (their per-token gaps are most of the
    7 kB) say about when a level's slow requests ran. H200 2026-12-05, absent c = 32: a tenth
    of the requests waited 0.4-0.7 s for their first token and the percentiles alone could
    not say which wave they were in."""
    def ms(v):
        return None if v is None else round(float(v), 3)

    rows = sorted(([ms(r.get("start")), ms(r.get("ttft")), ms(r.get("latency")),
                    r.get("output_tokens")] for r in records),
                  key=lambda row: (row[0] is None, row[0] or 0.0))
    return {"fields": list(TIMELINE_FIELDS), "rows": rows}

class UsageError(Exception):
    """A bad flag or a --out that does not fit: one line on stderr, exit 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise UsageError(message)


# ---- pure parts -----------------------------------------------------------------------------


def shape_configs(shape: str) -> tuple[dict, dict]:
    """The (target, draft) config.json of a shape: ``8b`` = gpu_e2e's, ``4b`` = the same with
    Qwen3-4B's fields (the draft keeps one layer, block 16 and its DFlash fields)."""
    if shape == "8b":
        return dict(e2e.TARGET_CONFIG), json.loads(json.dumps(e2e.DRAFT_CONFIG))
    if shape != "4b":
        raise UsageError(f"unknown --shape {shape!r}: {', '.join(SHAPES)}")
    target = e2e.TARGET_CONFIG | SHAPE_4B
    draft = json.loads(json.dumps(e2e.DRAFT_CONFIG)) | {
        k: v for k, v in SHAPE_4B.items() if k != "num_hidden_layers"}
    draft["num_target_layers"] = SHAPE_4B["num_hidden_layers"]
    return target, draft


def make_prompts(regimes: list[str], n: int, vocab: int, seed: int) -> dict[str, list[list[int]]]:
    """``n`` random-id prompts per regime (lengths 64..512, ids in [1000, vocab - 1000)).

    Each regime has its own rng (seeded by seed and name), so a regime's prompts do not depend
    on which other regimes run; they must differ across regimes (the plant is keyed by ids).
    """
    out: dict[str, list[list[int]]] = {}
    seen: set[tuple[int, ...]] = set()
    for regime in regimes:
        rng = random.Random(f"adaptive-grid:{seed}:{regime}")
        rows = []
        while len(rows) < n:
            ids = [rng.randrange(1000, vocab - 1000)
                   for _ in range(rng.randint(*PROMPT_LEN))]
            if tuple(ids) not in seen:  # never in practice; kept so the plant stays unambiguous
                seen.add(tuple(ids))
                rows.append(ids)
        out[regime] = rows
    return out


def linear_accept_length(ranks: list[int], tokens: int = NEW_TOKENS,
                         max_accept: int = BLOCK - 1) -> float:
    """Committed tokens per round of a linear chain over ``tokens`` tokens: each round accepts
    the consecutive rank-0 drafts after the bonus token (at most ``max_accept``) and commits
    them plus one. ``ranks[i]`` is the planted rank of continuation token i (gpu_e2e's
    schedule_ranks); what stock DFLASH earns from the same planted drafter."""
    pos, rounds = 0, 0
    while pos < tokens:
        a = 0
        while a < max_accept and pos + a + 1 < len(ranks) and ranks[pos + a + 1] == 0:
            a += 1
        pos += a + 1
        rounds += 1
    return tokens / rounds


def regime_ranks(regime: str, n: int) -> list[int]:
    return e2e.schedule_ranks(SCHEDULES[regime], n)


def regime_linear_accept(regime: str, conts: list[list[int]] | None = None,
                         n_prompts: int = 1) -> float:
    """Average of linear_accept_length over the regime's prompts (equal lengths, so equal)."""
    lengths = [len(c) for c in conts] if conts else [CONT_TOKENS] * n_prompts
    vals = [linear_accept_length(regime_ranks(regime, n)) for n in lengths]
    return round(sum(vals) / len(vals), 4)


@dataclass(frozen=True)
class Mode:
    label: str  # none | dflash | ddtree-<N> | ddtree-adaptive
    algorithm: str
    budget: int | None = None
    adaptive: bool = False

    @property
    def policy(self) -> str | None:
        if self.algorithm != "ddtree":
            return None
        return "adaptive" if self.adaptive else "fixed"


def parse_mode(label: str, adaptive_budget: int) -> Mode:
    if label in ("none", "dflash"):
        return Mode(label, label)
    if label == "ddtree-adaptive":
        return Mode(label, "ddtree", adaptive_budget, True)
    head, _, n = label.partition("-")
    if head == "ddtree" and n.isdigit() and int(n) > 0:
        return Mode(label, "ddtree", int(n))
    raise UsageError(f"unknown mode {label!r}: none, dflash, ddtree-<N>, ddtree-adaptive")


def round_cost(mode: Mode, c: int) -> float:
    """A round's cost relative to a plain decoding step at the same c, for time estimates only
    (the prior for a mode not measured yet; measured ratios replace it): about flat up to
    TOKEN_CAP verified tokens (c x width) and growing with them beyond; a DFLASH round (draft +
    verify) costs about two decode steps; a DDTree round DDTREE_ROUND (ADAPTIVE_ROUND for the
    adaptive policy, which narrows or falls back where a wide tree does not pay) DFLASH
    rounds, whatever the budget (on the H200, budget 64 cost about what 16 did)."""
    if mode.algorithm == "none":
        return 1 + c / TOKEN_CAP
    dflash = 2.0 * (1 + c * BLOCK / TOKEN_CAP)
    if mode.algorithm == "dflash":
        return dflash
    return dflash * (ADAPTIVE_ROUND if mode.adaptive else DDTREE_ROUND)


@dataclass(frozen=True)
class Level:
    """A measured level, for time estimates: ``work`` = (seconds - BENCH_OVERHEAD_S) x accept
    length, the level's rounds-times-round-time at accept length 1 (rounds ~ 1 / accept)."""

    mode: Mode
    regime: str | None
    c: int
    work: float
    warmup: bool  # the server's first level: it also ran the warm-up request


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def work_at(levels: list[Level], label: str, c: int) -> float | None:
    """One mode's work at c (median over its regimes) from its levels without the warm-up
    (with it only when there are no others): those at c, else those at the nearest measured
    c scaled by round_cost. None when the mode has no level."""
    rows = [x for x in levels if x.mode.label == label]
    pool = [x for x in rows if not x.warmup] or rows
    if not pool:
        return None
    near = min({x.c for x in pool}, key=lambda k: (abs(k.bit_length() - c.bit_length()), k))
    mode = pool[0].mode
    return _median([x.work for x in pool if x.c == near]) \
        * round_cost(mode, c) / round_cost(mode, near)


def work_ratio(levels: list[Level], a: Mode, b: Mode, c: int) -> float:
    """A round of ``a`` against one of ``b`` at c: measured (median over the levels where
    both are measured) when both are, else round_cost's ratio."""
    both = sorted({x.c for x in levels if x.mode.label == a.label and not x.warmup}
                  & {x.c for x in levels if x.mode.label == b.label and not x.warmup})
    ratios = [wa / wb for k in both
              if (wa := work_at(levels, a.label, k)) and (wb := work_at(levels, b.label, k))]
    return _median(ratios) if ratios else round_cost(a, c) / round_cost(b, c)


def estimate_level(levels: list[Level], mode: Mode, accept: float, c: int, *,
                   first: bool = False, requests_per_level: int = MIN_REQUESTS_PER_LEVEL,
                   default: float = 20.0) -> float:
    """Seconds for one level of ``mode`` at c with the given expected accept length, from the
    measured levels: the same mode's at c (other regimes); else every other mode's measured
    at c, scaled by the measured per-round cost ratio (where both are measured; else the
    round_cost prior), the median of those; else the same mode's nearest level; ``default``
    before any level is measured. ``first``: the server's first level (+ the warm-up, one
    more request)."""
    own = [x.work for x in levels if x.mode.label == mode.label and x.c == c and not x.warmup]
    preds = []
    for label in dict.fromkeys(x.mode.label for x in levels if x.mode.label != mode.label):
        other = next(x.mode for x in levels if x.mode.label == label)
        if (w := work_at(levels, label, c)) is not None:
            preds.append(w * work_ratio(levels, mode, other, c))
    if own:
        work = _median(own)
    elif any(x.mode.label == mode.label for x in levels) and not (
            preds and any(x.c == c for x in levels if x.mode.label != mode.label)):
        work = work_at(levels, mode.label, c)  # its nearest level: nothing else measured at c
    elif preds:
        work = _median(preds)
    else:
        return default
    seconds = work / max(accept, 1.0)
    if first:
        seconds *= 1 + 1 / (requests_per_level * c)
    return BENCH_OVERHEAD_S + seconds


def estimate_start(starts: list[tuple[bool, float, bool]], adaptive: bool,
                   prior: float) -> float:
    """A server's start (to ready), from the measured starts ``(adaptive, ready_seconds,
    first_of_its_run)``: the median of the warm ones of the same kind, else of the plain ones
    (+ ADAPTIVE_EXTRA_S for an adaptive server). A run's first start may have been a cold
    machine (H200: 225 s cold, 55-92 s warm); it counts as warm only within COLD_FACTOR of the
    warm plain starts. With only such starts, the smaller of their median and ``prior``; with
    none, ``prior``."""
    extra = ADAPTIVE_EXTRA_S if adaptive else 0.0
    warm_plain = [t for a, t, first in starts if not a and not first]
    ref = _median(warm_plain) if warm_plain else None
    ok = [(a, t) for a, t, first in starts
          if not first or (ref is not None and t <= COLD_FACTOR * (ref + (
              ADAPTIVE_EXTRA_S if a else 0.0)))]
    same = [t for a, t in ok if a == adaptive]
    if same:
        return _median(same)
    plain = [t for a, t in ok if not a]
    if plain:
        return _median(plain) + extra
    if starts:
        return min(_median([t for _, t, _ in starts]), prior) + extra
    return prior + extra


def parse_list(text: str, what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise UsageError(f"--{what} is empty")
    if len(set(items)) != len(items):
        raise UsageError(f"--{what} {text!r} names an entry twice")
    return items


def parse_levels(text: str) -> list[int]:
    items = parse_list(text, "levels")
    if not all(x.isdigit() and int(x) > 0 for x in items):
        raise UsageError(f"--levels {text!r}: positive integers, e.g. 1,2,4,8")
    return sorted(int(x) for x in items)


def parse_regimes(text: str) -> list[str]:
    items = parse_list(text, "regimes")
    for r in items:
        if r not in SCHEDULES:
            raise UsageError(f"unknown regime {r!r}: {', '.join(SCHEDULES)}")
    return items


def plant_document(prompts: dict[str, list[list[int]]], conts: dict[tuple, list[int]]) -> dict:
    """The TEST-ONLY plant file: every regime's prompts with that regime's ranks."""
    reqs = []
    for regime, rows in prompts.items():
        for ids in rows:
            cont = conts[tuple(ids)]
            reqs.append({"input_ids": ids, "continuation": cont,
                         "ranks": regime_ranks(regime, len(cont))})
    return {"test_only": True, "requests": reqs, "logp_profile": list(e2e.PLANT_PROFILE)}


def cell_key(regime: str, mode: str, c: int) -> str:
    return f"{regime}|{mode}|{c}"


def grid_cells(results: dict, regimes: list[str], modes: list[str],
               levels: list[int]) -> list[dict]:
    """The measured cells in grid order (regime, mode, concurrency); none's are shared."""
    cells = []
    for regime in regimes:
        for mode in modes:
            for c in levels:
                if mode == "none":
                    rec = results.get("none_levels", {}).get(str(c))
                else:
                    rec = results.get("cells", {}).get(cell_key(regime, mode, c))
                if not rec or rec.get("tok_s") is None:
                    continue
                run = rec.get("run")
                runs = results.get("runs", [])
                boot = (runs[run].get("boot_id") if isinstance(run, int) and 0 <= run < len(runs)
                        else None)
                cell = {"regime": regime, "concurrency": c, "mode": mode,
                        "tok_s": rec["tok_s"], "accept_length": rec.get("accept_length"),
                        "run": run, "boot_id": boot}
                if rec.get("underfilled_share") is not None:  # benches since 2026-12-06 night
                    cell["underfilled_share"] = round(rec["underfilled_share"], 4)
                if mode == "none":
                    cell["shared_across_regimes"] = True
                cells.append(cell)
    return cells


def same_boot(boot_ids) -> bool:
    """Cells from one boot of one machine (calls of one warm lease share it): what a ratio
    needs; unknown (no boot id recorded) counts as not the same."""
    ids = set(boot_ids)
    return len(ids) == 1 and None not in ids


def is_fixed_ddtree(label: str) -> bool:
    """``ddtree-<N>`` as parse_mode reads it (not the adaptive policy, not none or DFLASH)."""
    try:
        mode = parse_mode(label, 0)
    except UsageError:
        return False
    return mode.algorithm == "ddtree" and not mode.adaptive


def targets(cells: list[dict]) -> list[dict]:
    """Issue 14's targets for every (regime, c) whose cells are there."""
    at = {(x["regime"], x["concurrency"], x["mode"]): x["tok_s"] for x in cells}
    run = {(x["regime"], x["concurrency"], x["mode"]): x.get("run") for x in cells}
    boot = {(x["regime"], x["concurrency"], x["mode"]): x.get("boot_id") for x in cells}

    def same_run(regime: str, c: int, *modes: str) -> bool:
        """Compared cells from one run (one call of this command, one machine): a ratio across
        leases compares two machines and says so."""
        return len({run.get((regime, c, m)) for m in modes}) == 1

    def same_machine(regime: str, c: int, *modes: str) -> bool:
        return same_boot(boot.get((regime, c, m)) for m in modes)

    def row(regime: str, c: int, target: str, ratio: float | None, threshold: float,
            modes: tuple[str, ...]) -> dict:
        return {"regime": regime, "concurrency": c, "target": target,
                "ratio": None if ratio is None else round(ratio, 4), "threshold": threshold,
                "pass": ratio is not None and ratio >= threshold,
                "same_run": same_run(regime, c, *modes),
                "same_machine": same_machine(regime, c, *modes)}

    out = []
    for regime, c in sorted({(x["regime"], x["concurrency"]) for x in cells},
                            key=lambda rc: (rc[0], rc[1])):
        ada = at.get((regime, c, "ddtree-adaptive"))
        none, dflash = at.get((regime, c, "none")), at.get((regime, c, "dflash"))
        if ada is not None and none is not None and dflash is not None:
            best = max(none, dflash)
            out.append(row(regime, c, "ddtree-adaptive / max(none, dflash)",
                           ada / best if best else None, TARGET_VS_BEST,
                           ("ddtree-adaptive", "none", "dflash")))
        if regime == "branchy" and c <= BRANCHY_MAX_C and ada is not None and dflash is not None:
            out.append(row(regime, c, "ddtree-adaptive / dflash", ada / dflash if dflash else None,
                           TARGET_BRANCHY, ("ddtree-adaptive", "dflash")))
    return out


def versus_fixed(cells: list[dict]) -> list[dict]:
    """The adaptive policy against the best fixed budget measured in the same (regime, c): what
    picking N by hand for that one cell would have given. A reading, not a target: the policy
    picks without knowing the regime, a hand-picked N for one cell is wrong in others
    (gpu-results.md §40: 0.98-1.00 on branchy, 1.25-1.39 on absent)."""
    at = {(x["regime"], x["concurrency"], x["mode"]): x for x in cells if x.get("tok_s")}
    out = []
    for regime, c in sorted({(r, k) for r, k, _ in at}, key=lambda rc: (str(rc[0]), rc[1])):
        ada = at.get((regime, c, "ddtree-adaptive"))
        fixed = [x for (r, k, m), x in at.items() if r == regime and k == c
                 and is_fixed_ddtree(m)]
        if ada is None or not fixed:
            continue
        best = max(fixed, key=lambda x: x["tok_s"])
        out.append({"regime": regime, "concurrency": c, "best_fixed": best["mode"],
                    "ratio": round(ada["tok_s"] / best["tok_s"], 4),
                    "same_machine": same_boot((ada.get("boot_id"), best.get("boot_id")))})
    return out


def grid_document(results: dict, regimes: list[str], modes: list[str],
                  levels: list[int]) -> dict:
    cells = grid_cells(results, regimes, modes, levels)
    return {"cells": cells, "commands": list(results.get("commands", [])),
            "machine": results.get("machine", {}), "targets": targets(cells),
            "versus_fixed": versus_fixed(cells),
            "linear_accept_length": {r: results.get("linear_accept_length", {}).get(r)
                                     for r in regimes},
            # planted greedy outputs == the no-speculation continuations, per mode and regime
            "greedy_identical": {m: {r: v.get("identical") for r, v in by_regime.items()}
                                 for m, by_regime in results.get("identity", {}).items()}}


def plot(grid_path: Path, png: Path) -> dict:
    """One panel per regime: tok/s against concurrency (log2 x, log y), a line per mode; a
    mode keeps its colour and marker in every panel, and one legend lists every mode.
    Returns what was drawn: ``{"colors": {(regime, mode): colour}, "legend": [mode, ...]}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    try:
        grid = json.loads(grid_path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{grid_path}: cannot read a grid file ({exc})") from None
    cells = grid.get("cells", [])
    regimes = list(dict.fromkeys(x["regime"] for x in cells))
    modes = list(dict.fromkeys(x["mode"] for x in cells))
    if not regimes:
        raise UsageError(f"{grid_path}: no cells to plot")
    markers = "osD^v<>phX*"
    fig, axes = plt.subplots(1, len(regimes), figsize=(5 * len(regimes), 4.2), squeeze=False,
                             sharey=True)
    lin = grid.get("linear_accept_length", {})
    drawn: dict = {"colors": {}, "legend": []}
    for ax, regime in zip(axes[0], regimes, strict=True):
        for i, mode in enumerate(modes):
            pts = sorted((x["concurrency"], x["tok_s"]) for x in cells
                         if x["regime"] == regime and x["mode"] == mode)
            if pts:
                ax.plot(*zip(*pts, strict=True), marker=markers[i % len(markers)],
                        color=f"C{i % 10}", markersize=7, markerfacecolor="none",
                        linewidth=1.4, label=mode, clip_on=False, zorder=3 + i)
                drawn["colors"][(regime, mode)] = ax.get_lines()[-1].get_color()
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        levels = sorted({x["concurrency"] for x in cells})
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.margins(x=0.08, y=0.1)
        acc = lin.get(regime)
        ax.set_title(f"{regime}" + (f" (linear accept {acc:g})" if acc else ""))
        ax.set_xlabel("concurrency")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("output tok/s")
    handles = {}
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    legend = axes[0][-1].legend([handles[m] for m in modes if m in handles],
                                [m for m in modes if m in handles], fontsize=8)
    drawn["legend"] = [t.get_text() for t in legend.get_texts()]
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return drawn


# ---- the run --------------------------------------------------------------------------------


NONE = Mode("none", "none")
DFLASH = Mode("dflash", "dflash")


@dataclass
class Opts:
    """What gpu_e2e.running_server reads (out, env, clock), plus this command's settings."""

    out: Path
    env: dict
    clock: e2e.Clock
    models: tuple[Path, Path]
    backend: str
    port: int
    levels: list[int]
    regimes: list[str]
    modes: list[Mode]
    requests_per_level: int
    start_estimate_s: float
    level_estimate_s: float
    grid_json: Path
    keep_records: bool = False
    settings: dict = field(default_factory=dict)


def server_policy(opts: Opts, mode: Mode) -> str | None:
    """The ddtree.policy a DDTree mode's server runs (and check --url expects): the adaptive
    one's from --adaptive-policy, kept in the settings only when not the default."""
    if mode.adaptive:
        return opts.settings.get("adaptive_policy", overlay_policy.POLICY_ADAPTIVE)
    return mode.policy


def server_config(opts: Opts, name: str, mode: Mode, environment: dict | None = None) -> dict:
    extra = ["--sampling-backend", "pytorch", "--cuda-graph-max-bs", str(max(opts.levels)),
             "--cuda-graph-backend-prefill", "disabled"]
    target, draft = opts.models
    cfg: dict = {
        "name": name, "model": str(target), "algorithm": mode.algorithm, "port": opts.port,
        "gpus": [0], "memFractionStatic": 0.7, "attentionBackend": opts.backend,
        "contextLength": CONTEXT_LENGTH, "loadFormat": "dummy", "skipTokenizerInit": True,
        "preflight": False, "startTimeout": 420, "extraArgs": extra,
    }
    padded = mode.algorithm == "ddtree" and opts.settings.get("padded_verify")
    if mode.algorithm != "none":
        # the padded verify (--padded-verify): the drafter off FlashInfer, the overlay's rule
        draft_backend = overlay_settings.PADDED_VERIFY_DRAFT_BACKEND if padded else opts.backend
        cfg |= {"draftModel": str(draft), "draftLoadFormat": "dummy",
                "draftAttentionBackend": draft_backend}
    if mode.algorithm == "ddtree":
        cfg["ddtree"] = {"budget": mode.budget, "policy": server_policy(opts, mode)}
    if mode.algorithm != "none" and "max_running_requests" in opts.settings:
        # --max-running-requests: SGLang's DFLASH hook caps an unset one at 48 (DDTree too)
        cfg["maxRunningRequests"] = opts.settings["max_running_requests"]
    if padded:
        environment = {**(environment or {}), **overlay_settings.padded_verify_env()}
    if environment:
        cfg["environment"] = environment
    return cfg


def boot_id() -> str | None:
    """This boot of this machine (Linux): calls on one warm device lease share it, a fresh
    machine has another, so cells from different calls can still be compared."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def machine() -> dict:
    out: dict = {"gpu": None, "driver": None, "python": platform.python_version(),
                 "torch": None}
    if shutil.which("nvidia-smi"):
        r = e2e.sh(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                   timeout=30)
        first = (r["stdout"].strip().splitlines() or [""])[0]
        name, _, driver = first.partition(",")
        out["gpu"], out["driver"] = name.strip() or None, driver.strip() or None
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        out["torch"] = importlib.metadata.version("torch")
    return out


def dflash_environment(environ) -> dict[str, str]:
    """The ``SGLANG_DFLASH_*`` switches this run's servers inherit (e.g. ``HOST_LENS=bound``),
    recorded with the run and in front of its command: they change what a cell measures."""
    return {k: environ[k] for k in sorted(environ)
            if k.startswith("SGLANG_DFLASH_") and k != "SGLANG_DFLASH_DDTREE_PROFILE"}


class Grid:
    def __init__(self, opts: Opts, argv: list[str]) -> None:
        self.opts = opts
        self.path = opts.out / "results.json"
        self.results = self._load()
        self.oracle_found: dict[tuple[str, str], object] = {}  # (regime, budget) -> accept
        self.run = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "argv": argv, "servers_started": 0, "benches": 0, "skipped": {},
                    "boot_id": boot_id(), "environment": dflash_environment(os.environ)}
        self.results["runs"].append(self.run)
        self.results["commands"].append(" ".join(
            [f"{k}={shlex.quote(v)}" for k, v in self.run["environment"].items()]
            + [shlex.join([sys.executable, "-m", "adaptive_grid", *argv])]))
        self.results["machine"] = machine()
        self.oracle_thread: threading.Thread | None = None

    def _load(self) -> dict:
        fresh = {"settings": self.opts.settings, "prompts": {}, "linear_accept_length": {},
                 "oracle_accept_length": {}, "none_levels": {}, "cells": {}, "checks": {},
                 "policy_state": {}, "identity": {}, "servers": {}, "runs": [],
                 "commands": []}
        old = earlier_results(self.path, self.opts.settings)
        return fresh if old is None else fresh | old

    # -- bookkeeping --

    def save(self) -> None:
        for (regime, budget), value in list(self.oracle_found.items()):  # atomic copy
            if regime == "error":
                self.results["oracle_error"] = value
            else:
                self.results["oracle_accept_length"].setdefault(regime, {})[budget] = value
        self.run["elapsed_s"] = round(time.monotonic() - self.opts.clock.t0, 1)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.results, indent=1))
        tmp.replace(self.path)
        grid = grid_document(self.results, self.opts.regimes, [m.label for m in self.opts.modes],
                             self.opts.levels)
        self.opts.grid_json.parent.mkdir(parents=True, exist_ok=True)
        self.opts.grid_json.write_text(json.dumps(grid, indent=1))

    def command(self, cmd: list[str]) -> None:
        self.results["commands"].append(shlex.join(cmd))

    def skip(self, server: str, reason: str) -> None:
        self.run["skipped"][server] = reason
        print(f"[adaptive_grid] skip {server}: {reason}", flush=True)

    def done(self, regime: str, mode: str, c: int) -> bool:
        if mode == "none":
            rec = self.results["none_levels"].get(str(c))
        else:
            rec = self.results["cells"].get(cell_key(regime, mode, c))
        return bool(rec) and rec.get("tok_s") is not None

    def mode(self, label: str) -> Mode:
        return parse_mode(label, self.opts.settings["adaptive_budget"])

    def expected_accept(self, mode: Mode, regime: str | None) -> float:
        """What a (mode, regime) should accept: 1 without speculation, the linear chain for
        DFLASH, the CPU oracle (once it is there, else the linear chain) for DDTree."""
        if mode.algorithm == "none" or regime is None:
            return 1.0
        linear = self.results["linear_accept_length"].get(regime) or 1.0
        if mode.algorithm == "dflash":
            return linear
        return self.results["oracle_accept_length"].get(regime, {}).get(str(mode.budget),
                                                                          linear)

    def measured_levels(self) -> list[Level]:
        """Every measured level, for the estimates. A level is its server's first (it ran the
        warm-up) when its row says so or, in an older results.json, when its bench command
        had ``--warmup 1``."""
        warm_json = {Path(cmd.split(" --json ")[1].split()[0]).name
                     for cmd in self.results.get("commands", [])
                     if " --warmup 1 " in cmd and " --json " in cmd}
        rows = [*({"regime": k.split("|")[0], **r} for k, r in self.results["cells"].items()),
                *({"mode": "none", "regime": None, **r}
                  for r in self.results["none_levels"].values())]
        out = []
        for r in rows:
            if r.get("tok_s") is None or not r.get("seconds") or not r.get("concurrency"):
                continue
            try:
                mode = self.mode(r["mode"])
            except UsageError:
                continue
            acc = r.get("accept_length") or self.expected_accept(mode, r["regime"])
            warmup = r["warmup"] if "warmup" in r else r.get("bench_json") in warm_json
            out.append(Level(mode, r["regime"], r["concurrency"],
                             max(r["seconds"] - BENCH_OVERHEAD_S, 0.0) * acc, bool(warmup)))
        return out

    def level_estimate(self, mode: Mode, regime: str | None, c: int,
                       first: bool = False) -> float:
        """Seconds for one level (estimate_level over the measured levels);
        --level-estimate-s before any."""
        return estimate_level(self.measured_levels(), mode, self.expected_accept(mode, regime),
                              c, first=first,
                              requests_per_level=getattr(self.opts, "requests_per_level",
                                                         MIN_REQUESTS_PER_LEVEL),
                              default=self.opts.level_estimate_s)

    def levels_estimate(self, mode: Mode, regime: str | None, levels: list[int],
                        first: bool) -> float:
        """Seconds for these levels on one server; ``first``: the server benches nothing
        before them (the first of them runs the warm-up)."""
        return sum(self.level_estimate(mode, regime, c, first and i == 0)
                   for i, c in enumerate(levels))

    def measured_starts(self) -> list[tuple[bool, float, bool]]:
        """(adaptive, ready_seconds, first start of its run) of every measured server start.
        The first of a run: ``start_index`` 0, or in an older results.json the smallest pid
        among that run's servers."""
        recs = [(name, rec) for name, recs in self.results["servers"].items() for rec in recs]
        first_pid: dict = {}
        for _, rec in recs:
            if rec.get("pid") is not None:
                run = rec.get("run")
                first_pid[run] = min(first_pid.get(run, rec["pid"]), rec["pid"])
        out = []
        for name, rec in recs:
            if not rec.get("ready_seconds"):
                continue
            if "start_index" in rec:
                first = rec["start_index"] == 0
            else:
                first = rec.get("pid") == first_pid.get(rec.get("run"))
            out.append((name == "ddtree-adaptive" or bool(rec.get("config", {}).get(
                "ddtree", {}).get("policy") == "adaptive"), rec["ready_seconds"], first))
        return out

    def start_estimate(self, mode: Mode) -> float:
        """A server's start and stop: estimate_start over the measured starts (prior:
        --start-estimate-s, a warm start and its stop) + STOP_S."""
        return estimate_start(self.measured_starts(), mode.adaptive,
                              self.opts.start_estimate_s - STOP_S) + STOP_S

    def regime_estimate(self, mode: Mode, regime: str, levels: list[int], first: bool) -> float:
        """One regime's levels on a speculative server and what follows them: the check and,
        on a DDTree server, the identity run."""
        return CHECK_ESTIMATE_S + (IDENTITY_ESTIMATE_S if mode.algorithm == "ddtree" else 0.0) \
            + self.levels_estimate(mode, regime, levels, first)

    def server_estimate(self, mode: Mode, todo: dict[str, list[int]],
                        continuations: bool = False) -> float:
        """A server's start, its pending levels (``todo``: regime -> levels; for ``none`` the
        key is ignored), its checks and identity runs, and its stop."""
        if mode.algorithm == "none":
            levels = next(iter(todo.values()), [])
            return self.start_estimate(mode) + CHECK_ESTIMATE_S \
                + IDENTITY_ESTIMATE_S * len(self.opts.regimes) \
                + (CONTINUATIONS_ESTIMATE_S if continuations else 0.0) \
                + self.levels_estimate(mode, None, levels, True)
        return self.start_estimate(mode) + sum(
            self.regime_estimate(mode, r, cs, i == 0) for i, (r, cs) in enumerate(todo.items()))

    def fits(self, server: str, seconds: float, what: str = "start + its levels") -> bool:
        left = self.opts.clock.left()
        if left < seconds:
            self.skip(server, f"time budget: needs ~{seconds:.0f}s ({what}), {left:.0f}s left")
            return False
        return True

    # -- servers --

    @contextlib.contextmanager
    def server(self, name: str, cfg: dict):
        """gpu_e2e.running_server, recorded in results.json however it ends. An interrupt
        (KeyboardInterrupt: SIGINT, or SIGTERM through main's handler) stops the server:
        running_server does, in its body and while it waits for ready; the serve process is
        also looked for by its config path and stopped here, in case it outlived that."""
        cfg_path = self.opts.out / f"config-{name}.json"
        self.command(e2e.cli(["serve", "--config", str(cfg_path), "--poll-interval", "0.5"]))
        index = self.run["servers_started"]
        self.run["servers_started"] += 1
        started: dict = {}
        cm = e2e.running_server(self.opts, cfg, name, started)
        try:
            url, rec = cm.__enter__()
        except BaseException:
            code = stop_children(cfg_path)  # running_server stops it first; this makes sure
            if code is None:
                code = started.get("serve_exit")
            self.record_server(name, {"config": cfg, "ready_seconds": None,
                                      "start_index": index, "interrupted": True,
                                      "serve_exit": code})
            raise
        rec["start_index"] = index
        t_stop = None
        try:
            try:
                yield url, rec
            except BaseException as exc:
                if not isinstance(exc, Exception):
                    rec["interrupted"] = True
                t_stop = time.monotonic()
                if not cm.__exit__(type(exc), exc, exc.__traceback__):
                    raise
            else:
                t_stop = time.monotonic()
                cm.__exit__(None, None, None)
        except BaseException:
            stop_children(cfg_path)  # interrupted while stopping: make sure it is gone
            raise
        finally:
            if t_stop is not None:
                rec["stop_seconds"] = round(time.monotonic() - t_stop, 1)
            self.record_server(name, rec)

    def record_server(self, name: str, rec: dict) -> None:
        keep = {k: v for k, v in rec.items() if k != "log_tail"}
        keep["log_tail"] = rec.get("log_tail", "")[-3000:]
        keep["run"] = len(self.results["runs"]) - 1
        self.results["servers"].setdefault(name, []).append(keep)
        self.save()

    def check(self, url: str, mode: Mode) -> dict:
        args = ["check", "--url", url, "--layer", "live", "--expect-algorithm", mode.algorithm]
        if mode.budget is not None:
            args += ["--expect-ddtree-budget", str(mode.budget),
                     "--expect-ddtree-policy", server_policy(self.opts, mode)]
        cmd = e2e.cli(args)
        self.command(cmd)
        res = e2e.sh(cmd, env=self.opts.env, timeout=120)
        line = next((ln.strip() for ln in res["stdout"].splitlines() if POLICY_CHECK in ln),
                    None)
        return {"rc": res["rc"], "policy_line": line, "stdout": res["stdout"][-2000:]}

    def bench(self, url: str, name: str, prompts: Path, mode: Mode, regime: str | None,
              c: int, first: bool) -> dict:
        """One `sglang-dflash bench` level: requests_per_level x c requests of 256 tokens, after
        e2e.WARMUP_WAVES unrecorded waves of c (a server's first batch of a size pays one-time
        costs, e.g. the 360-515 ms first-token stalls of §22's first c = 8 level; the second
        wave's requests arrive as others end, and §28's speculative servers paused ~0.39 s once
        at such a first split admission, after a one-wave warm-up)."""
        left = self.opts.clock.left()
        out = self.opts.out / f"bench-{name}-c{c}.json"
        cmd = e2e.cli(["bench", "--url", url, "--concurrency", str(c), "--num-prompts",
                       str(self.opts.requests_per_level * c), "--max-new-tokens",
                       str(NEW_TOKENS), "--temperature", "0", "--ignore-eos", "--prompts",
                       str(prompts), "--warmup", "1" if first else "0", "--warmup-waves",
                       str(e2e.WARMUP_WAVES),
                       *(["--freeze-gc"] if self.opts.settings.get("freeze_gc") else []),
                       "--json", str(out), "--quiet"])
        self.command(cmd)
        res = e2e.sh(cmd, env=self.opts.env, timeout=max(30.0, min(600.0, left - 10)))
        self.run["benches"] += 1
        row: dict = {"mode": mode.label, "concurrency": c, "rc": res["rc"],
                     "seconds": res["seconds"], "tok_s": None, "accept_length": None,
                     "run": len(self.results["runs"]) - 1, "bench_json": out.name,
                     "warmup": first}
        if out.exists():
            doc = json.loads(out.read_text())
            if not self.opts.keep_records:  # ~7 kB per request: 60 MB over the grid
                slim = {k: v for k, v in doc.items() if k != "records"}
                slim["timeline"] = request_timeline(doc.get("records", []))
                out.write_text(json.dumps(slim, indent=1))
            summ = [s for s in doc.get("summaries", []) if s.get("concurrency") == c]
            if summ:
                s = summ[0]
                row |= {"tok_s": s.get("output_tokens_per_s"),
                        "accept_length": s.get("accept_length"),
                        "requests": s.get("requests"), "ok": s.get("ok"),
                        "errors": s.get("errors"), "latency_p50": s.get("latency_p50"),
                        "itl_p50": s.get("itl_p50"), "ttft_p50": s.get("ttft_p50"),
                        "ttft_max": s.get("ttft_max"),
                        "underfilled_share": s.get("underfilled_share")}
        if res["rc"] != 0:
            row["stderr"] = res["stderr"][-1500:]
        return row

    def bench_levels(self, url: str, name: str, prompts: Path, mode: Mode,
                     regime: str | None, first: bool, reserve: float) -> int:
        """The missing levels of (regime, mode) in order, files named after ``name``, while
        each one's estimate + ``reserve`` (what the server still does after them: checks,
        stop) fits the time left; the first that does not is skipped with the rest of the
        regime's levels, left for the next call. The number of levels benched."""
        n = 0
        for c in self.opts.levels:
            if self.done(regime or "", mode.label, c):
                continue
            est, left = self.level_estimate(mode, regime, c, first), self.opts.clock.left()
            if left < est + reserve:
                rest = [k for k in self.opts.levels
                        if k >= c and not self.done(regime or "", mode.label, k)]
                self.skip(f"{name} c={c}", f"time budget: c={','.join(map(str, rest))} left "
                          f"for the next call (c={c} needs ~{est:.0f}s + {reserve:.0f}s after "
                          f"it, {left:.0f}s left)")
                break
            row = self.bench(url, name, prompts, mode, regime, c, first)
            first = False
            n += 1
            if mode.adaptive:  # what each slot learnt and ran up to this level (cumulative)
                row["policy_state"] = e2e.policy_state(url)
            if mode.algorithm == "none":
                self.results["none_levels"][str(c)] = row | {"shared_across_regimes": True}
            else:
                self.results["cells"][cell_key(regime, mode.label, c)] = row | {"regime": regime}
            self.save()
            tok_s, acc = row["tok_s"], row["accept_length"]
            under = row.get("underfilled_share")
            stall = (f", under half full {under:.0%} of it (first token after up to "
                     f"{row.get('ttft_max') or 0:.2f}s)" if under is not None and under > 0.05
                     else "")
            # the first token's share of a level (§41: chain c = 1 lost 10 % to DFLASH there)
            ttft = row.get("ttft_p50")
            first_token = "" if ttft is None else f", first token p50 {ttft * 1e3:.0f} ms"
            print(f"[adaptive_grid] {name} c={c}: "
                  f"{'-' if tok_s is None else f'{tok_s:.1f}'} tok/s, accept "
                  f"{'-' if acc is None else f'{acc:.2f}'} ({row['seconds']}s{first_token})"
                  f"{stall}", flush=True)
        return n

    # -- phases --

    def prompt_file(self, name: str, rows: list[list[int]]) -> Path:
        path = self.opts.out / f"prompts-{name}.jsonl"
        path.write_text("".join(json.dumps({"input_ids": ids}) + "\n" for ids in rows))
        return path

    def load_continuations(self, prompts: list[list[int]]) -> dict[tuple, list[int]] | None:
        path = self.opts.out / "continuations.json"
        if not path.exists():
            return None
        doc = json.loads(path.read_text())
        if doc.get("shape") != self.opts.settings["shape"] or \
                doc.get("backend") != self.opts.backend:
            return None
        have = {tuple(x["input_ids"]): x["continuation"] for x in doc.get("items", [])}
        if all(len(have.get(tuple(ids), ())) >= CONT_TOKENS for ids in prompts):
            return {tuple(ids): have[tuple(ids)][:CONT_TOKENS] for ids in prompts}
        return None

    def take_continuations(self, url: str, prompts: list[list[int]]) -> dict[tuple, list[int]]:
        """Greedy continuations of every prompt, all at once, saved to continuations.json."""
        def one(ids: list[int]) -> list[int]:
            r = e2e.http_json(url + "/generate", {"input_ids": ids, "sampling_params": {
                "temperature": 0, "max_new_tokens": CONT_TOKENS, "ignore_eos": True}},
                timeout=300)
            return r["output_ids"]

        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(len(prompts)) as pool:
            outs = list(pool.map(one, prompts))
        doc = {"shape": self.opts.settings["shape"], "backend": self.opts.backend,
               "tokens": CONT_TOKENS, "seconds": round(time.monotonic() - t0, 2),
               "items": [{"input_ids": ids, "continuation": o}
                         for ids, o in zip(prompts, outs, strict=True)]}
        (self.opts.out / "continuations.json").write_text(json.dumps(doc))
        return {tuple(ids): o for ids, o in zip(prompts, outs, strict=True)}

    def phase_none(self, prompts: dict[str, list[list[int]]]) -> dict | None:
        """The no-speculation server: continuations (if missing) and none's cells."""
        every = [ids for rows in prompts.values() for ids in rows]
        conts = self.load_continuations(every)
        want_none = any(m.label == "none" for m in self.opts.modes)
        missing = [c for c in self.opts.levels if want_none and not self.done("", "none", c)]
        if conts is not None and not missing:
            return conts
        name = "none"
        if not self.fits(name, self.server_estimate(NONE, {"*": missing}, conts is None)):
            return conts
        pfile = self.prompt_file("all", every)
        with self.server(name, server_config(self.opts, name, NONE)) as (url, rec):
            if rec["ready_seconds"]:
                if conts is None:
                    conts = self.take_continuations(url, every)
                    rec["continuations"] = len(conts)
                if missing:
                    self.bench_levels(url, name, pfile, NONE, None, True, CHECK_ESTIMATE_S
                                      + IDENTITY_ESTIMATE_S * len(prompts) + STOP_S)
                self.results["checks"].setdefault("none", {})["*"] = self.check(url, NONE)
                # The control: no speculation against its own continuations at other batch
                # sizes. A divergence here is bf16 batch-shape numerics, not speculation.
                for regime, rows in prompts.items():
                    self.results["identity"].setdefault("none", {})[regime] = \
                        self.identity(url, rows)
        return conts

    def phase_dflash(self, prompts: dict[str, list[list[int]]]) -> None:
        for regime in self.opts.regimes:
            missing = [c for c in self.opts.levels if not self.done(regime, "dflash", c)]
            if not missing:
                continue
            name = f"dflash-{regime}"
            if not self.fits(name, self.server_estimate(DFLASH, {regime: missing})):
                continue
            acc = self.results["linear_accept_length"][regime]
            env = {"SGLANG_SIMULATE_ACC_LEN": str(acc)}
            cfg = server_config(self.opts, name, DFLASH, env)
            pfile = self.prompt_file(regime, prompts[regime])
            with self.server(name, cfg) as (url, rec):
                rec["simulate_acc_len"] = acc
                if rec["ready_seconds"]:
                    self.bench_levels(url, name, pfile, DFLASH, regime, True,
                                      CHECK_ESTIMATE_S + STOP_S)
                    self.results["checks"].setdefault("dflash", {})[regime] = self.check(
                        url, DFLASH)

    def phase_ddtree(self, mode: Mode, prompts: dict[str, list[list[int]]],
                     plant: Path | None) -> None:
        """One DDTree server over its pending regimes. It starts when its first pending
        regime fits (start + that regime + stop); then each regime runs if its estimate
        (levels, check, identity, stop) fits the time left, else it is skipped, recorded,
        and left for the next call, which resumes it (levels likewise: bench_levels)."""
        todo = {r: [c for c in self.opts.levels if not self.done(r, mode.label, c)]
                for r in self.opts.regimes}
        todo = {r: cs for r, cs in todo.items() if cs}
        if not todo:
            return
        name = mode.label
        if plant is None:
            self.skip(name, "no continuations (phase none did not run): nothing to plant")
            return
        head = next(iter(todo))
        if not self.fits(name, self.server_estimate(mode, {head: todo[head]}),
                         f"start + its first pending regime, {head}"):
            return
        # Not SGLANG_DFLASH_DDTREE_PROFILE: the per-round profiler adds host work.
        env = {"SGLANG_DFLASH_DDTREE_PLANT": str(plant)}
        steps = int(self.opts.settings.get("nodraft_steps",
                                           overlay_settings.DEFAULT_NODRAFT_STEPS))
        if mode.policy == "adaptive":  # the no-draft round's decode steps, explicitly
            env[overlay_settings.NODRAFT_STEPS_ENV] = str(steps)
        cfg = server_config(self.opts, name, mode, env)
        first = True  # nothing benched on this server yet: the next level runs the warm-up
        with self.server(name, cfg) as (url, rec):
            rec["plant_file"] = str(plant)
            if not rec["ready_seconds"]:
                return
            after = CHECK_ESTIMATE_S + IDENTITY_ESTIMATE_S + STOP_S  # a regime's last level
            for regime, levels in todo.items():
                need = self.regime_estimate(mode, regime, levels, first) + STOP_S
                left = self.opts.clock.left()
                if left < need:
                    self.skip(f"{name}-{regime}", f"time budget: needs ~{need:.0f}s (its "
                              f"levels, check, identity and the stop), {left:.0f}s left: left "
                              "for the next call")
                    continue
                pfile = self.prompt_file(regime, prompts[regime])
                if not self.bench_levels(url, f"{name}-{regime}", pfile, mode, regime, first,
                                         after):
                    continue
                first = False
                self.results["checks"].setdefault(mode.label, {})[regime] = \
                    self.check(url, mode)
                self.results["identity"].setdefault(mode.label, {})[regime] = \
                    self.identity(url, prompts[regime])
                if mode.adaptive:
                    self.results["policy_state"].setdefault(mode.label, {})[regime] = \
                        e2e.policy_state(url)
                self.save()

    def identity(self, url: str, prompts: list[list[int]]) -> dict:
        """Losslessness on the planted regime, after the bench (the adaptive policy has learnt
        by then): greedy outputs against the no-speculation continuations, every prompt at
        once and the first few one at a time (different batch sizes, so different widths or
        fallbacks under the policy). ``first_diff`` None = identical."""
        have = self.load_continuations(prompts) or {}

        def one(ids: list[int]) -> int | None:
            try:
                r = e2e.http_json(url + "/generate", {"input_ids": ids, "sampling_params": {
                    "temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}},
                    timeout=300)
            except Exception as exc:  # recorded, the grid goes on
                return f"{type(exc).__name__}: {exc}"
            return e2e.first_diff(r["output_ids"], have.get(tuple(ids), [])[:NEW_TOKENS])

        with cf.ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(one, prompts))
        alone = [one(ids) for ids in prompts[:IDENTITY_SEQUENTIAL]]
        return {"batch": together, "one_at_a_time": alone,
                "identical": all(d is None for d in together + alone)}

    def oracle(self, conts_len: int) -> None:
        """The CPU oracle's accept length per (regime, budget) of the planted profile, in a
        thread: seconds per pair on a CPU core, while the none server starts. Context for the
        measured accept lengths (exact for fixed budgets where plant_oracle.boundary_margin
        is clear; for adaptive, the accept length of its largest budget)."""
        budgets = sorted({m.budget for m in self.opts.modes if m.budget is not None})
        todo = [(r, b) for r in self.opts.regimes for b in budgets
                if str(b) not in self.results["oracle_accept_length"].get(r, {})]
        if not todo:
            return

        def work() -> None:  # writes only self.oracle_found; save() merges it
            try:
                from sglang_dflash.sglang_overlay.diagnostics import plant as plant_mod
                from sglang_dflash.sglang_overlay.diagnostics import plant_oracle as oracle_mod
                for regime, budget in todo:
                    req = plant_mod.PlantedRequest((0,), tuple(range(conts_len)),
                                                   tuple(regime_ranks(regime, conts_len)))
                    rounds = oracle_mod.expected_rounds(
                        req, e2e.PLANT_PROFILE, budget=budget, block_size=BLOCK,
                        vocab=self.opts.settings["vocab"], max_new_tokens=NEW_TOKENS)
                    self.oracle_found[(regime, str(budget))] = round(NEW_TOKENS / len(rounds), 4)
            except Exception as exc:  # the oracle is context, never worth the run
                self.oracle_found[("error", "")] = f"{type(exc).__name__}: {exc}"

        self.oracle_thread = threading.Thread(target=work, daemon=True)
        self.oracle_thread.start()

    def main(self) -> None:
        opts = self.opts
        vocab = opts.settings["vocab"]
        prompts = make_prompts(opts.regimes, opts.settings["prompts_per_regime"], vocab,
                               opts.settings["seed"])
        for regime, rows in prompts.items():
            old = self.results["prompts"].get(regime)
            if old is not None and old != rows:  # same settings must give the same prompts
                raise RuntimeError(f"the prompts of regime {regime} changed")
            self.results["prompts"][regime] = rows
            self.results["linear_accept_length"][regime] = regime_linear_accept(
                regime, n_prompts=len(rows))
        if any(m.algorithm == "ddtree" for m in opts.modes):
            self.oracle(CONT_TOKENS)  # on the CPU while the first server starts
        self.save()
        conts = self.phase_none(prompts)
        plant = None
        if conts is not None:
            from sglang_dflash.sglang_overlay.diagnostics import plant as plant_mod
            doc = plant_document(prompts, conts)
            plant_mod.parse_plant(json.dumps(doc))  # the worker's own validation, here first
            plant = opts.out / "plant.json"
            plant.write_text(json.dumps(doc))
            self.results["linear_accept_length"] |= {
                r: regime_linear_accept(r, [conts[tuple(ids)] for ids in prompts[r]])
                for r in opts.regimes}
            self.save()
        if any(m.label == "dflash" for m in opts.modes):
            self.phase_dflash(prompts)
        # DDTree servers: adaptive first (with none and dflash it completes the targets),
        # then the fixed budgets in --modes order.
        for mode in sorted((m for m in opts.modes if m.algorithm == "ddtree"),
                           key=lambda m: not m.adaptive):
            self.phase_ddtree(mode, prompts, plant)
        if self.oracle_thread is not None:
            self.oracle_thread.join(timeout=max(1.0, min(120.0, opts.clock.left() - 5)))
        self.save()


def stop_children(cfg_path: Path, timeout: float = 40.0) -> int | None:
    """Stop this process's children whose command line names ``cfg_path`` (a serve process
    started with start_new_session, so its group is its own): SIGTERM to the group, SIGKILL
    after ``timeout`` s. The exit status of the last one; None when there was none."""
    me, want, pids = os.getpid(), str(cfg_path).encode(), []
    for pid in portowner.pids():
        if portowner.parent_pid(pid) != me:
            continue
        try:
            argv = (portowner.PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if want in argv:
            pids.append(pid)
    code = None
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while True:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere
                break
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                code = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.2)
    return code


EXPORT_FILES = ("results.json", "continuations.json")
EXPORT_TAR = "adaptive-grid-files.tgz"


def export(out: Path, grid_json: Path, dest: Path) -> list[Path]:
    """results.json, continuations.json (what a later resume needs), the grid file, and one
    tarball of everything else under --out but the model configs."""
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for src in [*(out / n for n in EXPORT_FILES), grid_json]:
        if src.exists() and src.resolve() != (dest / src.name).resolve():
            shutil.copyfile(src, dest / src.name)
        if src.exists():
            written.append(dest / src.name)
    skip = {*EXPORT_FILES, grid_json.name, EXPORT_TAR, "models", "results.tmp"}
    with tarfile.open(dest / EXPORT_TAR, "w:gz") as tar:
        for path in sorted(out.iterdir()):
            if path.name not in skip:
                tar.add(path, arcname=path.name)
    written.append(dest / EXPORT_TAR)
    return written


def earlier_results(path: Path, settings: dict) -> dict | None:
    """An earlier run's results.json, refused (UsageError) when measured with other
    settings: its cells would not be comparable."""
    if not path.exists():
        return None
    old = json.loads(path.read_text())
    if old.get("settings") != settings:
        before = old.get("settings", {})
        diff = sorted(k for k in set(settings) | set(before) if before.get(k) != settings.get(k))
        raise UsageError(f"{path} was measured with other settings ({', '.join(diff)}); "
                         "use another --out")
    return old


def build_parser() -> Parser:
    ap = Parser(prog="adaptive_grid", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="results, logs, models, plant (resumable)")
    ap.add_argument("--grid-json", type=Path, help="default --out/adaptive-grid.json")
    ap.add_argument("--site", help="the staged site dir(s), os.pathsep-separated: the servers' "
                    "PYTHONPATH (default: this process's PYTHONPATH)")
    ap.add_argument("--shape", default="4b", choices=SHAPES)
    ap.add_argument("--backend", default="flashinfer", choices=e2e.BACKENDS)
    ap.add_argument("--levels", default=",".join(map(str, LEVELS)))
    ap.add_argument("--requests-per-level", type=int, default=MIN_REQUESTS_PER_LEVEL,
                    help="requests per level = this x c (>= 4: steady state)")
    ap.add_argument("--allow-short", action="store_true",
                    help="allow --requests-per-level below 4")
    ap.add_argument("--prompts-per-regime", type=int, default=8)
    ap.add_argument("--regimes", default=",".join(REGIMES),
                    help=f"of {', '.join(SCHEDULES)} (scripts/gpu_e2e.py PLANT_SCHEDULES)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--adaptive-budget", type=int, default=64,
                    help="ddtree-adaptive's largest budget")
    ap.add_argument("--adaptive-policy", default=overlay_policy.POLICY_ADAPTIVE,
                    help="the ddtree-adaptive server's ddtree.policy: adaptive (the auto "
                         "schedule), adaptive:auto:<token cap> or adaptive:<schedule> (a "
                         "schedule experiment: give it its own --out)")
    ap.add_argument("--nodraft-steps", default=str(overlay_settings.DEFAULT_NODRAFT_STEPS),
                    help="decode steps of the adaptive server's no-draft round "
                    "(SGLANG_DFLASH_DDTREE_NODRAFT_STEPS, 1..64, default "
                    f"{overlay_settings.DEFAULT_NODRAFT_STEPS}, the server's)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompts")
    ap.add_argument("--port", type=int, default=e2e.PORT)
    ap.add_argument("--time-budget-s", type=float, default=0, help="0 = unbounded")
    ap.add_argument("--start-estimate-s", type=float, default=75.0,
                    help="a warm server's start + stop, for the time budget before one is "
                    "measured (H200 2026-12-03: 55-60 s + the stop)")
    ap.add_argument("--level-estimate-s", type=float, default=20.0,
                    help="one level before any level has been measured")
    ap.add_argument("--padded-verify", action="store_true",
                    help="DDTree servers plan FlashInfer from the host bound with the tree "
                    "verify padded to it (SGLANG_DFLASH_DDTREE_HOST_LENS=bound, the drafter on "
                    "Triton; docs/ddtree.md 'A padded verify'); FlashInfer only")
    ap.add_argument("--freeze-gc", action="store_true",
                    help="bench --freeze-gc at every level: the servers' garbage collectors "
                    "frozen after each level's warm-up (a grid of its own: resumes only with "
                    "the flag)")
    ap.add_argument("--max-running-requests", type=int, metavar="N",
                    help="the speculative servers' (dflash, ddtree-*; not none) "
                    "maxRunningRequests: SGLang's DFLASH argument hook resets an unset one to "
                    "48, so above c = 48 they would run fewer requests at once than none "
                    "(default: unset; a grid of its own: resumes only with the same N)")
    ap.add_argument("--export", type=Path, metavar="DIR",
                    help="at the end, copy results.json, the grid, continuations.json and a "
                    "tarball of the rest (logs, configs, bench summaries, plant) to DIR: four "
                    "files (the device tool brings back at most 8 from $OUT)")
    ap.add_argument("--keep-records", action="store_true",
                    help="keep the per-request records in the bench JSON files (default: the "
                    "summaries only)")
    ap.add_argument("--plot", nargs=2, type=Path, metavar=("GRID_JSON", "PNG"),
                    help="draw a grid file and exit (nothing else runs)")
    return ap


def setup(args: argparse.Namespace, argv: list[str]) -> Grid:
    if args.out is None:
        raise UsageError("--out is required (unless --plot)")
    if args.requests_per_level < 1:
        raise UsageError("--requests-per-level must be >= 1")
    if args.requests_per_level < MIN_REQUESTS_PER_LEVEL and not args.allow_short:
        raise UsageError(f"--requests-per-level {args.requests_per_level} < "
                         f"{MIN_REQUESTS_PER_LEVEL}: not steady state (pass --allow-short)")
    if args.prompts_per_regime < 1:
        raise UsageError("--prompts-per-regime must be >= 1")
    try:
        nodraft_steps = overlay_settings.parse_nodraft_steps(args.nodraft_steps)
    except overlay_settings.DDTreeConfigError as exc:
        raise UsageError(f"--nodraft-steps: {exc}") from None
    if args.adaptive_budget < 1:
        raise UsageError("--adaptive-budget must be >= 1")
    if args.max_running_requests is not None and args.max_running_requests < 1:
        raise UsageError("--max-running-requests must be >= 1")
    try:  # the servers' own parser: a schedule it refuses never reaches a server
        spec = overlay_policy.parse_policy(args.adaptive_policy, args.adaptive_budget,
                                           "--adaptive-policy")
    except overlay_policy.PolicyError as exc:
        raise UsageError(str(exc)) from None
    if not spec.adaptive:
        raise UsageError(f"--adaptive-policy {args.adaptive_policy!r}: not an adaptive policy "
                         "(the fixed budgets are the ddtree-<N> modes)")
    levels = parse_levels(args.levels)
    regimes = parse_regimes(args.regimes)
    modes = [parse_mode(m, args.adaptive_budget) for m in parse_list(args.modes, "modes")]
    target_cfg, draft_cfg = shape_configs(args.shape)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.site:
        site = [str(Path(p).resolve()) for p in args.site.split(os.pathsep) if p]
        sys.path[:0] = site  # the plant modules as the servers import them
    else:
        site = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(site), PYTHONUNBUFFERED="1")
    env.pop("SGLANG_DFLASH_DDTREE_PROFILE", None)
    settings = {"shape": args.shape, "backend": args.backend, "new_tokens": NEW_TOKENS,
                "requests_per_level": args.requests_per_level,
                "prompts_per_regime": args.prompts_per_regime, "seed": args.seed,
                "adaptive_budget": args.adaptive_budget, "vocab": target_cfg["vocab_size"],
                "nodraft_steps": nodraft_steps}
    if args.adaptive_policy != overlay_policy.POLICY_ADAPTIVE:  # earlier grids resume as they were
        settings["adaptive_policy"] = args.adaptive_policy
    if args.freeze_gc:  # likewise: kept only when on
        settings["freeze_gc"] = True
    if args.padded_verify:
        if args.backend != "flashinfer":
            raise UsageError("--padded-verify pads FlashInfer's tree verify to the bound: it "
                             "needs --backend flashinfer (Triton plans from the bound already)")
        settings["padded_verify"] = True
    if args.max_running_requests is not None:  # likewise: kept only when set
        settings["max_running_requests"] = args.max_running_requests
    earlier_results(out / "results.json", settings)  # before anything under --out changes
    opts = Opts(out=out, env=env, clock=e2e.Clock(args.time_budget_s),
                models=e2e.write_models(out / "models", target_cfg, draft_cfg),
                backend=args.backend, port=args.port, levels=levels, regimes=regimes,
                modes=modes, requests_per_level=args.requests_per_level,
                start_estimate_s=args.start_estimate_s, level_estimate_s=args.level_estimate_s,
                grid_json=(args.grid_json or out / "adaptive-grid.json").resolve(),
                keep_records=args.keep_records,
                settings=settings)
    return Grid(opts, argv)


def _interrupt(signum: int, frame) -> None:
    """SIGINT and SIGTERM (``timeout -s INT 545 ...``) raise KeyboardInterrupt naming the
    signal: the running server stops, results.json is saved, the export written (main)."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def signal_name(exc: BaseException) -> str:
    """The signal an interrupt came from. A signal that lands inside a codec (the ``idna``
    encode of a health probe's host name) comes out wrapped: a KeyboardInterrupt reading
    "encoding with 'idna' codec failed (KeyboardInterrupt: SIGTERM)" whose cause is ours; so
    walk the chain for the one ``_interrupt`` raised. Ctrl-C's own has no name: SIGINT."""
    names = {s.name for s in (signal.SIGINT, signal.SIGTERM)}
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, KeyboardInterrupt) and cur.args and cur.args[0] in names:
            return cur.args[0]
        cur = cur.__cause__ or cur.__context__
    return "SIGINT"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
        if args.plot:
            plot(*args.plot)
            print(f"[adaptive_grid] wrote {args.plot[1]}")
            return 0
        grid = setup(args, argv)
    except UsageError as exc:
        print(f"adaptive_grid: {exc}", file=sys.stderr)
        return 2
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        grid.main()
    except KeyboardInterrupt as exc:  # the server was stopped on the way out (Grid.server)
        for sig in previous:  # the saving and the export are not cut off by a second signal
            signal.signal(sig, signal.SIG_IGN)
        name = signal_name(exc)
        grid.run["interrupted"] = name
        grid.save()
        if args.export:
            export(grid.opts.out, grid.opts.grid_json, args.export)
        print(f"adaptive_grid: interrupted by {name} after {grid.run['elapsed_s']:.0f}s; "
              f"results saved in {grid.path}" + (f" and exported to {args.export}"
                                                  if args.export else "")
              + "; the same command resumes", file=sys.stderr)
        code = 130 if name == "SIGINT" else 143
        oracle = grid.oracle_thread
        if oracle is not None and oracle.is_alive():
            # The CPU oracle's thread is inside torch: interpreter shutdown around it aborts
            # (std::terminate, exit -6). Everything is written; leave without finalising.
            oracle.join(timeout=5)
            if oracle.is_alive():
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        return code
    finally:
        for sig, handler in previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
    if args.export:
        export(grid.opts.out, grid.opts.grid_json, args.export)
    doc = json.loads(grid.opts.grid_json.read_text())
    print(json.dumps({
        "cells": len(doc["cells"]), "targets": [(t["regime"], t["concurrency"], t["ratio"],
                                                 t["pass"]) for t in doc["targets"]],
        "versus_fixed": [(v["regime"], v["concurrency"], v["best_fixed"], v["ratio"])
                         for v in doc.get("versus_fixed", [])],
        "linear_accept_length": doc["linear_accept_length"],
        "oracle_accept_length": grid.results.get("oracle_accept_length"),
        "servers_started": grid.run["servers_started"], "skipped": grid.run["skipped"],
        "elapsed_s": grid.run.get("elapsed_s"), "grid": str(grid.opts.grid_json)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
