"""``benchmarks/adaptive_grid.py`` on the CPU: its pure parts, and the command end to end.

The command runs as a real process that starts real ``sglang-dflash serve`` processes; SGLang
cannot run here, so the SGLang stand-in (tests/standin) answers in its place, as in
tests/real_drafter/test_serve_pair.py. The stand-in ignores plants and SGLANG_SIMULATE_ACC_LEN
(its accept length is fixed), so only the flow, the files and the JSON are tested here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"
sys.path.insert(0, str(REPO / "benchmarks"))  # benchmarks/ has no __init__.py

import adaptive_grid as grid  # noqa: E402

from sglang_dflash.sglang_overlay.diagnostics import plant  # noqa: E402

REGIMES = ["absent", "chain"]
MODES = ["none", "dflash", "ddtree-8", "ddtree-adaptive"]
LEVELS = [1, 2]
TINY = ["--levels", "1,2", "--requests-per-level", "4", "--prompts-per-regime", "2",
        "--regimes", ",".join(REGIMES), "--modes", ",".join(MODES)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(*args: str, timeout: float = 120, dflash_env: dict | None = None,
         ) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_DFLASH_")}
    env.update(dflash_env or {}, STANDIN_TOKEN_DELAY="0.0002",
               PYTHONPATH=os.pathsep.join([str(STANDIN), str(REPO / "src"),
                                           str(REPO / "benchmarks")]))
    env.pop("NOTIFY_SOCKET", None)
    return subprocess.run([sys.executable, "-m", "adaptive_grid", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def _grid_run(out: Path, *extra: str, dflash_env: dict | None = None,
              ) -> subprocess.CompletedProcess:
    return _run("--out", str(out), "--site", f"{STANDIN}{os.pathsep}{REPO / 'src'}",
                "--port", str(_free_port()), *TINY, *extra, dflash_env=dflash_env)


# ---- pure parts ---------------------------------------------------------------------------


def test_linear_accept_length_of_the_regimes():
    n = grid.CONT_TOKENS
    assert grid.linear_accept_length(grid.regime_ranks("chain", n)) == 16.0
    assert grid.linear_accept_length(grid.regime_ranks("absent", n)) == 1.0
    # branchy (3,0,0,-1, 2,0,0,-1, 1,0,0,-1): rounds of 3 and 1 tokens alternate
    assert grid.linear_accept_length(grid.regime_ranks("branchy", n)) == 2.0
    # capped at 15 accepted drafts (block 16) and at the tokens asked for
    assert grid.linear_accept_length([0] * 40, tokens=32) == 16.0
    assert grid.linear_accept_length([0] * 40, tokens=32, max_accept=3) == 4.0
    assert grid.regime_linear_accept("chain", n_prompts=3) == 16.0


def test_prompts_are_seeded_distinct_and_independent_of_other_regimes():
    a = grid.make_prompts(["absent", "branchy", "chain"], 8, 151936, seed=0)
    b = grid.make_prompts(["chain"], 8, 151936, seed=0)
    assert a["chain"] == b["chain"]
    every = [tuple(p) for rows in a.values() for p in rows]
    assert len(set(every)) == len(every) == 24
    assert all(64 <= len(p) <= 512 and all(1000 <= t < 151936 - 1000 for t in p)
               for p in every)
    assert grid.make_prompts(["chain"], 8, 151936, seed=1)["chain"] != b["chain"]


def test_shapes():
    t4, d4 = grid.shape_configs("4b")
    assert (t4["hidden_size"], t4["intermediate_size"], t4["num_hidden_layers"],
            t4["tie_word_embeddings"]) == (2560, 9728, 36, True)
    assert d4["hidden_size"] == 2560 and d4["num_hidden_layers"] == 1
    assert d4["block_size"] == 16 and d4["tie_word_embeddings"] is True
    assert d4["dflash_config"] == {"mask_token_id": 151669, "target_layer_ids": [1, 17, 33]}
    t8, _ = grid.shape_configs("8b")
    assert t8 == grid.e2e.TARGET_CONFIG


def test_modes_and_targets():
    assert grid.parse_mode("ddtree-16", 64) == grid.Mode("ddtree-16", "ddtree", 16, False)
    assert grid.parse_mode("ddtree-adaptive", 64).budget == 64
    for bad in ("ddtree", "ddtree-0", "eagle", "ddtree-x"):
        with pytest.raises(grid.UsageError):
            grid.parse_mode(bad, 64)
    cells = [{"regime": "branchy", "concurrency": c, "mode": m, "tok_s": v}
             for c, (n, d, a) in {1: (100, 150, 200), 32: (1000, 800, 940)}.items()
             for m, v in (("none", n), ("dflash", d), ("ddtree-adaptive", a))]
    t = {(x["concurrency"], x["target"]): x for x in grid.targets(cells)}
    assert t[(1, "ddtree-adaptive / max(none, dflash)")]["pass"] is True
    assert t[(1, "ddtree-adaptive / dflash")]["ratio"] == pytest.approx(1.3333, abs=1e-4)
    assert t[(32, "ddtree-adaptive / max(none, dflash)")]["pass"] is False  # 0.94
    assert (32, "ddtree-adaptive / dflash") not in t  # only c <= 8
    assert all(x["same_run"] for x in t.values())  # no run recorded: one run
    # a ratio across two runs (two leases, two machines) says so
    later = [dict(x, run=1 if x["mode"] == "ddtree-adaptive" else 0) for x in cells]
    assert not any(x["same_run"] for x in grid.targets(later))
    # ... but two calls of one warm lease are one machine (one boot): comparable
    assert not any(x["same_machine"] for x in grid.targets(later))  # no boot id: unknown
    lease = [dict(x, boot_id="b1") for x in later]
    assert all(x["same_machine"] for x in grid.targets(lease))
    two = [dict(x, boot_id="b2" if x["mode"] == "ddtree-adaptive" else "b1") for x in later]
    assert not any(x["same_machine"] for x in grid.targets(two))


def test_versus_fixed_takes_the_best_fixed_budget_of_each_cell():
    """Adaptive against the fastest ddtree-<N> of the same (regime, c); none, DFLASH and cells
    without a tok/s are not fixed budgets; a cell without the adaptive one or any fixed one has
    no row; two boots are not one machine."""
    cells = [{"regime": r, "concurrency": c, "mode": m, "tok_s": v, "boot_id": "b1"}
             for r, c, m, v in [("branchy", 4, "none", 900), ("branchy", 4, "dflash", 1000),
                                ("branchy", 4, "ddtree-8", 1200), ("branchy", 4, "ddtree-64", 1250),
                                ("branchy", 4, "ddtree-16", None),
                                ("branchy", 4, "ddtree-adaptive", 1230),
                                ("absent", 4, "ddtree-8", 600), ("absent", 4, "none", 850),
                                ("chain", 4, "ddtree-adaptive", 5000)]]
    rows = grid.versus_fixed(cells)
    assert [(v["regime"], v["concurrency"], v["best_fixed"]) for v in rows] == [
        ("branchy", 4, "ddtree-64")]
    assert rows[0]["ratio"] == pytest.approx(0.984) and rows[0]["same_machine"] is True
    cells[3]["boot_id"] = "b2"
    assert grid.versus_fixed(cells)[0]["same_machine"] is False


def test_cells_carry_their_run_s_boot_id():
    results = {"runs": [{"boot_id": "b0"}, {"boot_id": "b1"}],
               "none_levels": {"1": {"tok_s": 5.0, "run": 0}},
               "cells": {grid.cell_key("absent", "dflash", 1): {"tok_s": 4.0, "run": 1}}}
    cells = grid.grid_cells(results, ["absent"], ["none", "dflash"], [1])
    assert [(x["mode"], x["boot_id"]) for x in cells] == [("none", "b0"), ("dflash", "b1")]
    assert grid.boot_id() is None or len(grid.boot_id()) > 8


def _estimator(results: dict) -> grid.Grid:
    """A Grid with only what the estimates read."""
    g = grid.Grid.__new__(grid.Grid)
    g.opts = type("O", (), {"settings": {"adaptive_budget": 64}, "level_estimate_s": 20.0,
                            "start_estimate_s": grid.build_parser().get_default(
                                "start_estimate_s"),
                            "requests_per_level": 4, "regimes": list(grid.REGIMES),
                            "levels": list(grid.LEVELS)})()
    g.results = {"linear_accept_length": {}, "oracle_accept_length": {}, "cells": {},
                 "none_levels": {}, "servers": {}, "commands": []} | results
    return g


def test_time_estimates_scale_with_rounds_and_measured_round_cost():
    """A level's estimate: the same mode's measurement scaled by accept length; another
    mode's scaled by the measured round-cost ratio where both are measured, else round_cost;
    the median, not the largest."""
    g = _estimator({"linear_accept_length": {"absent": 1.0, "chain": 16.0},
                    "oracle_accept_length": {"chain": {"64": 16.0}}})
    d64, oh = grid.parse_mode("ddtree-64", 64), grid.BENCH_OVERHEAD_S
    assert g.level_estimate(d64, "absent", 8) == 20.0  # nothing measured yet
    assert g.start_estimate(d64) == g.opts.start_estimate_s
    g.results["none_levels"]["8"] = {"mode": "none", "concurrency": 8, "tok_s": 1.0,
                                     "seconds": oh + 4, "accept_length": None}
    prior = grid.round_cost(d64, 8) / grid.round_cost(grid.NONE, 8)
    assert g.level_estimate(d64, "absent", 8) == pytest.approx(oh + 4 * prior)
    # a measured ratio replaces the prior: DFLASH measured at 16 (3x none's work there)
    g.results["none_levels"]["16"] = {"mode": "none", "concurrency": 16, "tok_s": 1.0,
                                      "seconds": oh + 5, "accept_length": None}
    g.results["cells"]["absent|dflash|16"] = {"mode": "dflash", "concurrency": 16,
                                              "tok_s": 1.0, "seconds": oh + 15,
                                              "accept_length": 1.0}
    assert g.level_estimate(grid.DFLASH, "chain", 8) == pytest.approx(oh + 4 * 3 / 16)
    # the same mode in another regime: its work over the accept length
    g.results["cells"]["absent|ddtree-64|8"] = {"mode": "ddtree-64", "concurrency": 8,
                                                "tok_s": 1.0, "seconds": oh + 32,
                                                "accept_length": 1.0}
    assert g.level_estimate(d64, "chain", 8) == pytest.approx(oh + 32 / 16)
    # a server's first level also runs the warm-up request
    assert g.level_estimate(d64, "chain", 8, first=True) == pytest.approx(
        oh + 2 * (1 + 1 / 32))
    assert grid.round_cost(grid.NONE, 1) < grid.round_cost(grid.DFLASH, 1) < \
        grid.round_cost(d64, 64)


def test_warmup_levels_count_only_without_others():
    """A server's first level ran the warm-up (on a cold machine, seconds of compiles): the
    nearest other level, scaled by round_cost, stands for it."""
    lv = [grid.Level(grid.NONE, None, 1, 13.0, True), grid.Level(grid.NONE, None, 2, 4.0, False)]
    assert grid.work_at(lv, "none", 1) == pytest.approx(
        4.0 * grid.round_cost(grid.NONE, 1) / grid.round_cost(grid.NONE, 2))
    assert grid.work_at(lv[:1], "none", 1) == 13.0
    assert grid.work_at(lv[:1], "none", 2) == pytest.approx(
        13.0 * grid.round_cost(grid.NONE, 2) / grid.round_cost(grid.NONE, 1))
    assert grid.work_at(lv, "dflash", 1) is None


def test_start_estimate_ignores_a_cold_start():
    """The median warm start; a run's first start counts only when near the warm ones (the
    H200's first, cold start took 225 s, the others 55-92 s); the adaptive extra only while
    no adaptive start is measured."""
    est, extra = grid.estimate_start, grid.ADAPTIVE_EXTRA_S
    assert est([], False, 70.0) == 70.0 and est([], True, 70.0) == 70.0 + extra
    cold = [(False, 225.5, True)]
    assert est(cold, False, 70.0) == 70.0  # only a start that may have been cold
    warm = [*cold, (False, 60.1, True), (False, 54.6, False), (False, 58.6, False)]
    assert est(warm, False, 70.0) == 58.6  # the cold one left out, the first-of-run 60.1 in
    assert est(warm, True, 70.0) == 58.6 + extra
    assert est([*warm, (True, 91.6, True)], True, 70.0) == 91.6
    # the same through results.json: the first of a run by start_index or, older, by pid
    g = _estimator({"servers": {
        "none": [{"ready_seconds": 225.5, "run": 0, "pid": 656}],
        "dflash-absent": [{"ready_seconds": 60.1, "run": 1, "pid": 1947}],
        "dflash-chain": [{"ready_seconds": 58.6, "run": 1, "pid": 2806}],
        "ddtree-8": [{"ready_seconds": 200.0, "run": 2, "start_index": 0},
                     {"ready_seconds": 54.0, "run": 3, "start_index": 1}]}})
    assert sorted(g.measured_starts()) == [(False, 54.0, False), (False, 58.6, False),
                                           (False, 60.1, True), (False, 200.0, True),
                                           (False, 225.5, True)]
    assert g.start_estimate(grid.NONE) == pytest.approx(_median([54.0, 58.6, 60.1])
                                                        + grid.STOP_S)


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


# What the H200 grid of 2026-12-03 measured (docs/gpu-runs/2026-12-03/grid.json, raw files
# at commit 78205dc): per (mode, regime) the call (run) and each level's (seconds, accept length)
# at c = 1 ... 64; none's seconds; each server's (run, pid, ready_seconds). Calls: 0 ran
# none (a cold machine: 225 s to ready); 1 the three DFLASH servers; 2 ddtree-adaptive and
# ddtree-8 (--time-budget-s 0); 4 ddtree-16 (its 12.5 s "start" answered from call 2's
# ddtree-16, left starting by the interrupt; the serve of call 4 exited 3, port taken).
H200_NONE = (0, [15.16, 5.29, 5.23, 5.84, 5.57, 6.06, 7.12])
H200_CELLS = {
    ("dflash", "absent"): (1, [(9.49, 1.0039), (8.45, 1.0039), (7.99, 1.0039), (9.09, 1.0039),
                               (10.93, 1.0039), (14.02, 1.0039), (25.29, 1.0039)]),
    ("dflash", "branchy"): (1, [(4.82, 2.0), (4.32, 2.0), (4.85, 2.0), (4.78, 2.0),
                                (5.62, 2.0), (7.54, 2.0), (13.75, 2.0)]),
    ("dflash", "chain"): (1, [(1.78, 16.0), (1.81, 16.0), (2.29, 16.0), (1.9, 16.0),
                              (2.08, 16.0), (2.42, 16.0), (3.74, 16.0)]),
    ("ddtree-adaptive", "absent"): (2, [(8.64, 1.0039), (7.54, 1.0039), (8.26, 1.0039),
                                        (8.93, 1.0039), (10.47, 1.0039), (9.79, 1.0039),
                                        (13.41, 1.0039)]),
    ("ddtree-adaptive", "branchy"): (2, [(5.61, 1.9357), (5.52, 1.872), (5.4, 2.5473),
                                         (6.34, 1.6151), (7.3, 1.3474), (8.27, 1.0119),
                                         (13.31, 1.0446)]),
    ("ddtree-adaptive", "chain"): (2, [(1.97, 16.0), (2.23, 16.0), (1.99, 16.0),
                                       (2.43, 16.0), (2.59, 15.7538), (3.42, 13.8378),
                                       (4.13, 15.8147)]),
    ("ddtree-8", "absent"): (2, [(11.93, 1.0039), (9.63, 1.0039), (10.06, 1.0039),
                                 (10.83, 1.0039), (14.2, 1.0039), (16.91, 1.0039),
                                 (32.42, 1.0039)]),
    ("ddtree-8", "branchy"): (2, [(5.03, 2.0157), (5.43, 2.0157), (5.86, 2.0157),
                                  (6.24, 2.0157), (7.21, 2.0157), (9.13, 2.0157),
                                  (15.72, 2.0157)]),
    ("ddtree-8", "chain"): (2, [(2.25, 8.8276), (2.46, 8.8276), (2.74, 8.8276),
                                (2.76, 8.8276), (3.54, 8.8276), (3.89, 8.8276),
                                (5.63, 8.8276)]),
    ("ddtree-16", "absent"): (4, [(13.28, 1.0039), (12.24, 1.0039), (11.19, 1.0039),
                                  (13.29, 1.0039), (15.46, 1.0039), (21.34, 1.0039),
                                  (40.95, 1.0039)]),
    ("ddtree-16", "branchy"): (4, [(5.54, 2.0157), (6.06, 2.0157), (6.74, 2.0157),
                                   (6.53, 2.0157), (8.01, 2.0157), (11.29, 2.0157),
                                   (21.57, 2.0157)]),
    ("ddtree-16", "chain"): (4, [(2.02, 16.0), (2.01, 16.0), (2.06, 16.0), (2.08, 16.0),
                                 (2.4, 16.0), (3.0, 16.0), (4.69, 16.0)]),
}
H200_SERVERS = {"none": (0, 656, 225.5), "dflash-absent": (1, 1947, 60.1),
                "dflash-branchy": (1, 2416, 54.6), "dflash-chain": (1, 2806, 58.6),
                "ddtree-adaptive": (2, 3234, 91.6), "ddtree-8": (2, 4101, 55.1),
                "ddtree-16": (4, 5123, 12.5)}
H200_ACCEPT = {"linear_accept_length": {"absent": 1.0, "branchy": 2.0, "chain": 16.0},
               "oracle_accept_length": {
                   "absent": {"8": 1.0039, "16": 1.0039, "64": 1.0039},
                   "branchy": {"8": 2.0157, "16": 2.0157, "64": 3.0118},
                   "chain": {"8": 8.8276, "16": 16.0, "64": 16.0}}}


def _h200_state(calls: int) -> dict:
    """results.json as the H200 grid left it after ``calls`` calls, in the old schema (no
    warmup or start_index fields: the warm-up levels are known from the bench commands)."""
    levels = list(grid.LEVELS)
    res: dict = {**H200_ACCEPT, "cells": {}, "none_levels": {}, "servers": {}, "commands": []}
    run, seconds = H200_NONE
    if run < calls:
        for i, (c, sec) in enumerate(zip(levels, seconds, strict=True)):
            res["none_levels"][str(c)] = {"mode": "none", "concurrency": c, "tok_s": 1.0,
                                          "seconds": sec, "accept_length": None, "run": run,
                                          "bench_json": f"bench-none-c{c}.json"}
            res["commands"].append(f"py -m sglang_dflash bench --warmup {int(i == 0)} "
                                   f"--json /root/grid/bench-none-c{c}.json --quiet")
    for (mode, regime), (run, rows) in H200_CELLS.items():
        if run >= calls:
            continue
        first = mode == "dflash" or regime == "absent"  # the server's first regime
        for i, (c, (sec, acc)) in enumerate(zip(levels, rows, strict=True)):
            name = f"bench-{mode}-{regime}-c{c}.json"
            res["cells"][grid.cell_key(regime, mode, c)] = {
                "mode": mode, "regime": regime, "concurrency": c, "tok_s": 1.0,
                "seconds": sec, "accept_length": acc, "run": run, "bench_json": name}
            res["commands"].append(f"py -m sglang_dflash bench --warmup "
                                   f"{int(first and i == 0)} --json /root/grid/{name} --quiet")
    for name, (run, pid, ready) in H200_SERVERS.items():
        if run < calls:
            res["servers"][name] = [{"ready_seconds": ready, "run": run, "pid": pid}]
    return res


def _h200_took(name: str) -> float:
    """What a server took on the H200: its start (ready_seconds) + its levels' seconds."""
    ready = H200_SERVERS[name][2]
    mode, _, regime = name.partition("-") if name.startswith("dflash") else (name, "", "")
    rows = [sec for (m, r), (_, cells) in H200_CELLS.items()
            if m == mode and (not regime or r == regime) for sec, _ in cells]
    return ready + sum(rows)


@pytest.mark.parametrize("calls", [1, 2])
def test_estimates_replay_the_h200_grid(calls):
    """Fed the state the H200 grid had after call 1 (only none measured) and after call 2
    (none and DFLASH), the estimator's server estimates are within 0.6x..1.6x of what each
    later server took (the old estimator's were 2.1-3.6x: 388 s for a 145 s dflash-absent,
    706 s for a 229 s ddtree-adaptive, more than a call)."""
    g = _estimator(_h200_state(calls))
    later = [n for n, (run, _, _) in H200_SERVERS.items() if run >= calls]
    assert later
    ratios = {}
    for name in later:
        if name.startswith("dflash-"):
            mode, todo = grid.DFLASH, {name.removeprefix("dflash-"): list(grid.LEVELS)}
        else:
            mode, todo = grid.parse_mode(name, 64), {r: list(grid.LEVELS) for r in grid.REGIMES}
        ratios[name] = round(g.server_estimate(mode, todo) / _h200_took(name), 2)
    assert all(0.6 <= r <= 1.6 for r in ratios.values()), ratios
    # and so the call-1 state lets dflash-absent start with the 245 s that call had left
    if calls == 1:
        assert g.server_estimate(grid.DFLASH, {"absent": list(grid.LEVELS)}) < 245


# ---- the command against the stand-in -----------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One grid run and, with the same --out, a second one (resume)."""
    out = tmp_path_factory.mktemp("grid") / "out"
    first = _grid_run(out, "--nodraft-steps", "8",
                      dflash_env={"SGLANG_DFLASH_DDTREE_HOST_LENS": "bound"})
    assert first.returncode == 0, first.stderr[-3000:]
    # each level's line names its first token's median (§41: where chain c = 1 lost to DFLASH)
    assert re.search(r"\[adaptive_grid\] ddtree-8-chain c=2: [\d.]+ tok/s, accept [\d.]+ "
                     r"\([\d.]+s, first token p50 \d+ ms\)", first.stdout), first.stdout[-2000:]
    res1 = json.loads((out / "results.json").read_text())
    grid1 = json.loads((out / "adaptive-grid.json").read_text())
    logs = {p.name: p.stat().st_mtime_ns for p in out.glob("serve-*.log")}
    export = out.parent / "export"
    second = _grid_run(out, "--nodraft-steps", "8", "--export", str(export))
    assert second.returncode == 0, second.stderr[-3000:]
    return {"out": out, "export": export, "res1": res1, "grid1": grid1, "logs1": logs,
            "res2": json.loads((out / "results.json").read_text()),
            "grid2": json.loads((out / "adaptive-grid.json").read_text())}


def test_grid_schema_and_every_cell(runs):
    doc = runs["grid1"]
    assert set(doc) == {"cells", "commands", "machine", "targets", "versus_fixed",
                        "linear_accept_length", "greedy_identical"}
    # the one fixed budget of this run is the best fixed one in every (regime, c)
    assert {(v["regime"], v["concurrency"], v["best_fixed"]) for v in doc["versus_fixed"]} == {
        (r, c, "ddtree-8") for r in REGIMES for c in LEVELS}
    at = {(x["regime"], x["concurrency"], x["mode"]): x["tok_s"] for x in doc["cells"]}
    for v in doc["versus_fixed"]:
        r, c = v["regime"], v["concurrency"]
        assert v["ratio"] == pytest.approx(at[(r, c, "ddtree-adaptive")] / at[(r, c, "ddtree-8")],
                                           abs=1e-4)
    assert doc["greedy_identical"] == {m: {r: True for r in REGIMES}
                                       for m in ("none", "ddtree-8", "ddtree-adaptive")}
    assert {(x["regime"], x["mode"], x["concurrency"]) for x in doc["cells"]} == {
        (r, m, c) for r in REGIMES for m in MODES for c in LEVELS}
    for x in doc["cells"]:
        assert {"regime", "concurrency", "mode", "tok_s", "accept_length"} <= set(x)
        assert x["tok_s"] > 0
        if x["mode"] == "none":
            assert x["shared_across_regimes"] is True and x["accept_length"] is None
        else:
            assert x["accept_length"] == pytest.approx(3.0, abs=0.05)  # the stand-in's
    assert set(doc["machine"]) == {"gpu", "driver", "python", "torch"}
    assert doc["linear_accept_length"] == {"absent": 1.0, "chain": 16.0}
    # one target per (regime, c): branchy is not in this run
    assert {(t["regime"], t["concurrency"]) for t in doc["targets"]} == {
        (r, c) for r in REGIMES for c in LEVELS}
    assert all(isinstance(t["pass"], bool) for t in doc["targets"])
    cmds = doc["commands"]
    # the first call ran with a switch its servers inherit: it heads that call's command
    assert cmds[0].split()[0] == "SGLANG_DFLASH_DDTREE_HOST_LENS=bound"
    assert cmds[0].split()[2:4] == ["-m", "adaptive_grid"]
    assert [r["environment"] for r in runs["res2"]["runs"]] == [
        {"SGLANG_DFLASH_DDTREE_HOST_LENS": "bound"}, {}]
    serves = [Path(c.split(" serve --config ")[1].split()[0]).stem
              for c in cmds if " serve --config " in c]
    # none first, dflash per regime, then DDTree: adaptive first (the targets' last column)
    assert serves == ["config-none", "config-dflash-absent", "config-dflash-chain",
                      "config-ddtree-adaptive", "config-ddtree-8"]
    assert sum(" bench " in c for c in cmds) == 2 * (1 + 2 + 2 + 2)
    assert all("--num-prompts 4 " in c for c in cmds if "--concurrency 1 " in c)
    assert all("--num-prompts 8 " in c for c in cmds if "--concurrency 2 " in c)


def test_bench_files_keep_the_summaries_only(runs):
    doc = json.loads((runs["out"] / "bench-ddtree-8-chain-c2.json").read_text())
    assert "records" not in doc and doc["summaries"][0]["concurrency"] == 2
    rows = doc["timeline"]["rows"]  # each request's start, TTFT, latency, tokens
    assert len(rows) == doc["summaries"][0]["requests"]
    assert [r[0] for r in rows] == sorted(r[0] for r in rows) and all(r[3] > 0 for r in rows)
    cell = runs["res1"]["cells"]["chain|ddtree-8|2"]
    assert cell["bench_json"] == "bench-ddtree-8-chain-c2.json" and cell["rc"] == 0
    assert cell["requests"] == cell["ok"] == 8
    # the stall signals (H200 §37): the longest first-token wait and the share under half full
    assert 0.0 <= cell["underfilled_share"] <= 1.0 and cell["ttft_max"] > 0.0
    assert cell["ttft_max"] == pytest.approx(max(r[1] for r in rows), abs=1e-3)  # ms rounding
    assert cell["ttft_p50"] == pytest.approx(statistics.median(r[1] for r in rows), abs=1e-3)


def test_export_writes_four_files(runs):
    import tarfile

    names = sorted(p.name for p in runs["export"].iterdir())
    assert names == ["adaptive-grid-files.tgz", "adaptive-grid.json", "continuations.json",
                     "results.json"]
    with tarfile.open(runs["export"] / "adaptive-grid-files.tgz") as tar:
        inside = set(tar.getnames())
    assert {"plant.json", "serve-ddtree-8.log", "config-none.json",
            "bench-none-c1.json"} <= inside
    assert not any(n.startswith("models") for n in inside)


def test_server_configs(runs):
    out = runs["out"]
    cfg = {p.stem.removeprefix("config-"): json.loads(p.read_text())
           for p in out.glob("config-*.json")}
    assert set(cfg) == {"none", "dflash-absent", "dflash-chain", "ddtree-8", "ddtree-adaptive"}
    for c in cfg.values():
        assert c["loadFormat"] == "dummy" and c["skipTokenizerInit"] is True
        assert c["contextLength"] == 2048 and c["memFractionStatic"] == 0.7
        assert c["preflight"] is False and c["attentionBackend"] == "flashinfer"
        args = c["extraArgs"]
        assert args[args.index("--cuda-graph-max-bs") + 1] == "2"
        assert args[args.index("--sampling-backend") + 1] == "pytorch"
        assert args[args.index("--cuda-graph-backend-prefill") + 1] == "disabled"
        assert "SGLANG_DFLASH_DDTREE_PROFILE" not in c.get("environment", {})
    assert cfg["dflash-absent"]["environment"] == {"SGLANG_SIMULATE_ACC_LEN": "1.0"}
    assert cfg["dflash-chain"]["environment"] == {"SGLANG_SIMULATE_ACC_LEN": "16.0"}
    assert cfg["ddtree-8"]["ddtree"] == {"budget": 8, "policy": "fixed"}
    assert cfg["ddtree-adaptive"]["ddtree"] == {"budget": 64, "policy": "adaptive"}
    plant = {"SGLANG_DFLASH_DDTREE_PLANT": str(out / "plant.json")}
    assert cfg["ddtree-8"]["environment"] == plant
    # --nodraft-steps reaches the adaptive server only
    assert cfg["ddtree-adaptive"]["environment"] == plant | {
        "SGLANG_DFLASH_DDTREE_NODRAFT_STEPS": "8"}
    assert json.loads((out / "models" / "target" / "config.json").read_text())[
        "hidden_size"] == 2560


def test_plant_file_matches_the_regimes(runs):
    out, res = runs["out"], runs["res1"]
    doc = json.loads((out / "plant.json").read_text())
    assert doc["test_only"] is True and doc["logp_profile"] == list(grid.e2e.PLANT_PROFILE)
    conts = {tuple(x["input_ids"]): x["continuation"]
             for x in json.loads((out / "continuations.json").read_text())["items"]}
    expected = [(regime, ids) for regime in REGIMES for ids in res["prompts"][regime]]
    assert len(doc["requests"]) == len(expected) == 4
    for req, (regime, ids) in zip(doc["requests"], expected, strict=True):
        assert req["input_ids"] == ids
        assert len(req["continuation"]) == grid.CONT_TOKENS == 273
        assert req["continuation"] == conts[tuple(ids)]
        assert req["ranks"] == grid.e2e.schedule_ranks(dict(grid.e2e.PLANT_SCHEDULES)[regime],
                                                       273)
    plant.parse_plant(json.dumps(doc))  # the worker accepts it


def test_results_record_checks_policy_and_oracle(runs):
    res = runs["res1"]
    assert res["linear_accept_length"] == {"absent": 1.0, "chain": 16.0}
    for mode in ("ddtree-8", "ddtree-adaptive"):
        for regime in REGIMES:
            chk = res["checks"][mode][regime]
            assert chk["rc"] == 0, chk
            assert "ddtree_policy" in chk["policy_line"]
    assert "policy adaptive" in res["checks"]["ddtree-adaptive"]["chain"]["policy_line"]
    # the stand-in reports SGLang's speculative cap (48: the grid ran without
    # --max-running-requests), which check names after the policy
    assert res["checks"]["ddtree-8"]["absent"]["policy_line"].endswith(
        "policy fixed (budget 8); at most 48 running requests (SGLang's default for a "
        "speculative server: more wait in its queue; maxRunningRequests lifts it)")
    assert res["policy_state"]["ddtree-adaptive"]["absent"]["budget"] == 64
    # and after every level of the adaptive server, what its slots had learnt and run by then
    levels = [row for key, row in res["cells"].items() if "|ddtree-adaptive|" in key]
    assert levels and all(row["policy_state"]["budget"] == 64 for row in levels)
    assert not any("policy_state" in row for key, row in res["cells"].items()
                   if "|ddtree-adaptive|" not in key)
    # the stand-in is deterministic: planted greedy outputs equal the continuations, at once
    # and one at a time
    for mode in ("none", "ddtree-8", "ddtree-adaptive"):  # none: the numerics control
        for regime in REGIMES:
            ident = res["identity"][mode][regime]
            assert ident["identical"] is True, ident
            assert len(ident["batch"]) == 2 and len(ident["one_at_a_time"]) == 2
    assert res["checks"]["none"]["*"]["rc"] == 0
    assert res["checks"]["dflash"]["chain"]["rc"] == 0
    assert res["runs"][0]["servers_started"] == 5 and not res["runs"][0]["skipped"]


def test_results_record_the_cpu_oracle(runs):
    """The oracle builds the planted trees with the DDTree core (torch)."""
    pytest.importorskip("torch", reason="the plant oracle builds trees with the DDTree core")
    res = runs["res1"]
    assert res["oracle_accept_length"]["chain"] == {"8": 8.8276, "64": 16.0}
    assert res["oracle_accept_length"]["absent"]["64"] == pytest.approx(256 / 255, abs=1e-4)


def test_resume_starts_no_server_and_keeps_the_cells(runs):
    res2 = runs["res2"]
    assert len(res2["runs"]) == 2
    assert res2["runs"][1]["servers_started"] == 0 and res2["runs"][1]["benches"] == 0
    logs = {p.name: p.stat().st_mtime_ns for p in runs["out"].glob("serve-*.log")}
    assert logs == runs["logs1"] and len(logs) == 5
    assert runs["grid2"]["cells"] == runs["grid1"]["cells"]
    assert runs["grid2"]["commands"][:len(runs["grid1"]["commands"])] == \
        runs["grid1"]["commands"]


def test_other_settings_in_the_same_out_are_refused(runs):
    r = _run("--out", str(runs["out"]), "--shape", "8b", *TINY)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "shape" in r.stderr


def test_time_budget_skips_a_server_rather_than_cutting_it(tmp_path):
    out = tmp_path / "o"
    r = _run("--out", str(out), "--site", f"{STANDIN}{os.pathsep}{REPO / 'src'}", "--port",
             str(_free_port()), "--time-budget-s", "60", "--start-estimate-s", "100", *TINY)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    skipped = res["runs"][0]["skipped"]
    assert set(skipped) == {"none", "dflash-absent", "dflash-chain", "ddtree-8",
                            "ddtree-adaptive"}
    assert "time budget" in skipped["none"] and "nothing to plant" in skipped["ddtree-8"]
    assert res["runs"][0]["servers_started"] == 0 and not list(out.glob("serve-*.log"))
    assert json.loads((out / "adaptive-grid.json").read_text())["cells"] == []


@pytest.mark.parametrize("flags, words", [
    (["--requests-per-level", "2"], "--requests-per-level 2"),
    (["--regimes", "absent,nope"], "nope"),
    (["--modes", "none,eagle"], "eagle"),
    (["--levels", "1,x"], "--levels"),
    (["--no-such-flag"], "--no-such-flag"),
    (["--nodraft-steps", "0"], "--nodraft-steps"),
    (["--adaptive-policy", "fixed"], "not an adaptive policy"),
    (["--adaptive-policy", "adaptive:auto:x"], "token cap is not an integer"),
    (["--adaptive-policy", "adaptive:1:0,7"], "no range lists the server's budget N=64"),
    (["--max-running-requests", "0"], "--max-running-requests must be >= 1"),
    (["--max-running-requests", "x"], "--max-running-requests: invalid int value"),
])
def test_bad_flags_exit_2_with_one_line(tmp_path, flags, words):
    r = _run("--out", str(tmp_path / "o"), *flags)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and words in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_allow_short(tmp_path):
    """--allow-short takes --requests-per-level below 4 (checked before anything starts:
    with an unknown mode after it, the mode is the error)."""
    r = _run("--out", str(tmp_path / "o"), "--requests-per-level", "2", "--allow-short",
             "--modes", "bogus")
    assert r.returncode == 2 and "bogus" in r.stderr


def test_plot_writes_a_png(runs, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: --plot needs it")
    png = tmp_path / "grid.png"
    r = _run("--plot", str(runs["out"] / "adaptive-grid.json"), str(png))
    assert r.returncode == 0, r.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_plot_keeps_a_mode_s_colour_in_every_panel(tmp_path):
    """A mode missing from one panel (here ddtree-64, measured on one regime only, as on the
    H200) must not shift the colours of the modes after it; the legend lists every mode."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: --plot needs it")
    import adaptive_grid

    cells = [{"regime": r, "concurrency": c, "mode": m, "tok_s": 100.0 * c, "accept_length": 1}
             for r in ("absent", "chain") for c in (1, 2)
             for m in ("none", "ddtree-64", "ddtree-adaptive")
             if not (m == "ddtree-64" and r == "chain")]
    grid = tmp_path / "g.json"
    grid.write_text(json.dumps({"cells": cells}))
    drawn = adaptive_grid.plot(grid, tmp_path / "g.png")
    colors = drawn["colors"]
    assert colors[("absent", "ddtree-adaptive")] == colors[("chain", "ddtree-adaptive")]
    assert colors[("absent", "none")] == colors[("chain", "none")]
    assert drawn["legend"] == ["none", "ddtree-64", "ddtree-adaptive"]
# ---- DDTree regimes one by one, against a clock (no processes) ---------------------------


class _Clock:
    def __init__(self, budget: float) -> None:
        self.t, self.budget = 0.0, budget

    def left(self) -> float:
        return self.budget - self.t


class _TimedGrid(grid.Grid):
    """phase_ddtree's decisions without processes: a start, a level, a check and an identity
    run only advance the clock (by start_s, level_s, 4 s and 4 s)."""

    def __init__(self, budget: float, results: dict, start_s: float = 60.0,
                 level_s: float = 20.0) -> None:
        self.opts = grid.Opts(out=Path("/nonexistent"), env={}, clock=_Clock(budget),
                              models=(Path("t"), Path("d")), backend="flashinfer", port=1,
                              levels=[1, 2], regimes=["absent", "chain"], modes=[],
                              requests_per_level=4, start_estimate_s=75.0,
                              level_estimate_s=20.0, grid_json=Path("/nonexistent/g.json"),
                              settings={"adaptive_budget": 64})
        self.results, self.start_s, self.level_s = results, start_s, level_s
        self.run = {"servers_started": 0, "benches": 0, "skipped": {}}
        self.log: list[tuple] = []

    @contextlib.contextmanager
    def server(self, name, cfg):
        self.opts.clock.t += self.start_s
        self.log.append(("start", name))
        yield "url", {"ready_seconds": self.start_s}
        self.opts.clock.t += 3

    def bench(self, url, name, prompts, mode, regime, c, first):
        self.opts.clock.t += self.level_s
        self.log.append(("bench", regime, c))
        return {"mode": mode.label, "concurrency": c, "seconds": self.level_s, "tok_s": 1.0,
                "accept_length": 1.0, "warmup": first, "run": 0}

    def check(self, url, mode):
        self.opts.clock.t += 4
        return {"rc": 0}

    def identity(self, url, prompts):
        self.opts.clock.t += 4
        return {"identical": True}

    def prompt_file(self, name, rows):
        return Path(f"prompts-{name}.jsonl")

    def save(self) -> None:
        pass


def _fresh_results() -> dict:
    return {"linear_accept_length": {"absent": 1.0, "chain": 1.0}, "oracle_accept_length": {},
            "cells": {}, "none_levels": {}, "servers": {}, "commands": [], "checks": {},
            "identity": {}, "policy_state": {}}


def test_ddtree_starts_for_its_first_regime_and_leaves_the_rest():
    """Start (75 s estimated) + the first regime (2 x 20 s + check 4 + identity 4) + stop 8
    fit in 140 s: the server starts; after it (60 s) and absent (48 s), chain's ~56 s do not
    fit the 32 s left: skipped with the reason, and the next call runs only chain."""
    d8 = grid.parse_mode("ddtree-8", 64)
    prompts = {"absent": [[1]], "chain": [[2]]}
    g = _TimedGrid(140.0, _fresh_results())
    g.phase_ddtree(d8, prompts, Path("plant.json"))
    assert g.log == [("start", "ddtree-8"), ("bench", "absent", 1), ("bench", "absent", 2)]
    assert list(g.run["skipped"]) == ["ddtree-8-chain"]
    assert "left for the next call" in g.run["skipped"]["ddtree-8-chain"]
    assert set(g.results["checks"]["ddtree-8"]) == {"absent"}
    assert set(g.results["identity"]["ddtree-8"]) == {"absent"}
    again = _TimedGrid(140.0, g.results)
    again.phase_ddtree(d8, prompts, Path("plant.json"))
    assert again.log == [("start", "ddtree-8"), ("bench", "chain", 1), ("bench", "chain", 2)]
    assert not again.run["skipped"]
    assert {k for k in again.results["cells"]} == {
        grid.cell_key(r, "ddtree-8", c) for r in ("absent", "chain") for c in (1, 2)}


def test_ddtree_does_not_start_when_its_first_regime_does_not_fit():
    d8 = grid.parse_mode("ddtree-8", 64)
    g = _TimedGrid(120.0, _fresh_results())  # needs 75 + 48 = 123
    g.phase_ddtree(d8, {"absent": [[1]], "chain": [[2]]}, Path("plant.json"))
    assert g.log == [] and "first pending regime, absent" in g.run["skipped"]["ddtree-8"]


def test_a_level_that_does_not_fit_is_left_for_the_next_call():
    """Inside a started regime each level needs its estimate + what follows it (check,
    identity, stop): with the levels slower than estimated, c=2 is left."""
    d8 = grid.parse_mode("ddtree-8", 64)
    g = _TimedGrid(125.0, _fresh_results(), start_s=50.0, level_s=45.0)
    g.phase_ddtree(d8, {"absent": [[1]], "chain": [[2]]}, Path("plant.json"))
    assert g.log == [("start", "ddtree-8"), ("bench", "absent", 1)]
    assert "c=2 left for the next call" in g.run["skipped"]["ddtree-8-absent c=2"]
    assert "ddtree-8-chain" in g.run["skipped"]


# ---- interrupts ------------------------------------------------------------------------


def _popen(out: Path, *extra: str, **env: str) -> subprocess.Popen:
    full = dict(os.environ, STANDIN_TOKEN_DELAY="0.0002", **env,
                PYTHONPATH=os.pathsep.join([str(STANDIN), str(REPO / "src"),
                                            str(REPO / "benchmarks")]))
    full.pop("NOTIFY_SOCKET", None)
    return subprocess.Popen([sys.executable, "-m", "adaptive_grid", "--out", str(out),
                             "--site", f"{STANDIN}{os.pathsep}{REPO / 'src'}", "--port",
                             str(_free_port()), *TINY, *extra], env=full, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(pred, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _levels_written(out: Path) -> int:
    try:
        return len(json.loads((out / "results.json").read_text())["none_levels"])
    except (OSError, ValueError, KeyError):
        return 0


def _serving(cfg: Path) -> list[int]:
    """Processes whose command line names this config (a serve process and its server)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if str(cfg).encode() in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def test_sigint_stops_the_server_saves_exports_and_resumes(tmp_path):
    out, export = tmp_path / "o", tmp_path / "export"
    p = _popen(out, "--export", str(export))
    _wait_for(lambda: _levels_written(out) >= 1 or p.poll() is not None)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=90)
    assert p.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("adaptive_grid: interrupted by SIGINT")
    assert (export / "results.json").exists() and (export / "adaptive-grid.json").exists()
    res = json.loads((export / "results.json").read_text())
    assert res["runs"][0]["interrupted"] == "SIGINT"
    assert 1 <= len(res["none_levels"]) < len(LEVELS) or res["cells"] == {}
    assert res["servers"]["none"][0]["interrupted"] is True
    assert res["servers"]["none"][0]["serve_exit"] is not None
    _wait_for(lambda: not _serving(out / "config-none.json"), timeout=10)
    again = _grid_run(out)
    assert again.returncode == 0, again.stderr[-3000:]
    doc = json.loads((out / "adaptive-grid.json").read_text())
    assert {(x["regime"], x["mode"], x["concurrency"]) for x in doc["cells"]} == {
        (r, m, c) for r in REGIMES for m in MODES for c in LEVELS}


def test_sigterm_while_a_server_starts_stops_it(tmp_path):
    """Outside running_server's try (waiting for ready) the serve process is found by its
    config path and stopped; the call exits 143 with one line."""
    out = tmp_path / "o"
    p = _popen(out, STANDIN_READY_DELAY="120")
    cfg = out / "config-none.json"
    try:
        _wait_for(lambda: ((out / "serve-none.log").exists() and _serving(cfg))
                  or p.poll() is not None)
        time.sleep(1.0)  # waiting for /health (the stand-in answers 503 for 120 s)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("adaptive_grid: interrupted by SIGTERM")
    rec = json.loads((out / "results.json").read_text())["servers"]["none"][0]
    assert rec["ready_seconds"] is None and rec["interrupted"] is True
    assert rec["serve_exit"] is not None
    _wait_for(lambda: not _serving(cfg), timeout=10)


def _codec_that_is_interrupted(name: str):
    """A real codec whose encode is cut by our SIGTERM handler's exception, as the idna
    encode of a health probe's host name was (2026-12-06, the README venv run)."""
    import codecs

    def encode(text, errors="strict"):
        raise KeyboardInterrupt("SIGTERM")

    def search(wanted):
        if wanted != name:
            return None
        return codecs.CodecInfo(encode, lambda b, errors="strict": (str(b), len(b)), name=name)
    codecs.register(search)
    return search


def test_a_signal_caught_inside_a_codec_is_still_named():
    """Python wraps an exception raised inside a codec (3.11: a KeyboardInterrupt reading
    "encoding with '…' codec failed (KeyboardInterrupt: SIGTERM)", ours its cause); the
    one-line message and the exit code must still say SIGTERM."""
    import codecs
    search = _codec_that_is_interrupted("sgldflash_interrupted")
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            "host".encode("sgldflash_interrupted")
    finally:
        codecs.unregister(search)
    assert grid.signal_name(info.value) == "SIGTERM"
    assert grid.signal_name(KeyboardInterrupt("SIGINT")) == "SIGINT"
    assert grid.signal_name(KeyboardInterrupt()) == "SIGINT"  # Ctrl-C's own
    wrapped = KeyboardInterrupt("encoding with 'x' codec failed")
    wrapped.__context__ = ValueError("unrelated")
    assert grid.signal_name(wrapped) == "SIGINT"


def test_the_request_timeline_keeps_when_each_request_ran():
    """The bench JSON files drop their per-request records (7 kB each, most of it per-token
    gaps); the timeline keeps start, time to first token, latency and tokens, in start order."""
    records = [
        {"start": 0.51234, "ttft": 0.5281, "latency": 1.577, "output_tokens": 256,
         "itl": [0.1] * 9},
        {"start": 0.0, "ttft": 0.1319, "latency": 1.3471, "output_tokens": 256, "itl": []},
        {"start": None, "ttft": None, "latency": None, "output_tokens": 0, "error": "refused"},
    ]
    t = grid.request_timeline(records)
    assert t["fields"] == ["start", "ttft", "latency", "output_tokens"]
    assert t["rows"] == [[0.0, 0.132, 1.347, 256], [0.512, 0.528, 1.577, 256],
                         [None, None, None, 0]]
    assert len(json.dumps(t)) < 200


def test_adaptive_policy_reaches_the_adaptive_server_only_and_pins_the_out(tmp_path):
    """--adaptive-policy (a schedule experiment) goes into the adaptive server's ddtree.policy,
    the fixed modes keep theirs, and an --out measured under another policy is refused."""
    out = tmp_path / "o"
    argv = ["--out", str(out), "--site", str(REPO / "src"), *TINY,
            "--adaptive-policy", "adaptive:auto:520"]
    g = grid.setup(grid.build_parser().parse_args(argv), argv)
    by_label = {m.label: m for m in g.opts.modes}
    adaptive = grid.server_config(g.opts, "a", by_label["ddtree-adaptive"])
    fixed = grid.server_config(g.opts, "f", by_label["ddtree-8"])
    assert adaptive["ddtree"] == {"budget": 64, "policy": "adaptive:auto:520"}
    assert fixed["ddtree"] == {"budget": 8, "policy": "fixed"}
    assert g.opts.settings["adaptive_policy"] == "adaptive:auto:520"
    # check --url expects what the server runs, not the default schedule
    assert grid.server_policy(g.opts, by_label["ddtree-adaptive"]) == "adaptive:auto:520"
    assert grid.server_policy(g.opts, by_label["ddtree-8"]) == "fixed"
    g.save()
    plain = ["--out", str(out), "--site", str(REPO / "src"), *TINY]
    with pytest.raises(grid.UsageError, match=r"other settings \(adaptive_policy\)"):
        grid.setup(grid.build_parser().parse_args(plain), plain)
    # the default policy leaves the settings as before (earlier grids still resume)
    other = tmp_path / "p"
    plain[1] = str(other)
    g2 = grid.setup(grid.build_parser().parse_args(plain), plain)
    assert "adaptive_policy" not in g2.opts.settings
    assert grid.server_config(g2.opts, "a", by_label["ddtree-adaptive"])["ddtree"] == {
        "budget": 64, "policy": "adaptive"}


def test_adaptive_policy_grid_runs_and_checks_the_schedule_it_set(tmp_path):
    """End to end on the stand-in: the adaptive server runs --adaptive-policy's schedule and
    check --url passes against that schedule (budget 64 offered at bs 8: 8 x 65 = 520)."""
    out = tmp_path / "o"
    r = _run("--out", str(out), "--site", f"{STANDIN}{os.pathsep}{REPO / 'src'}", "--port",
             str(_free_port()), "--levels", "1", "--requests-per-level", "4",
             "--prompts-per-regime", "2", "--regimes", "absent", "--modes",
             "none,ddtree-adaptive", "--adaptive-policy", "adaptive:auto:520")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    checks = res["checks"]["ddtree-adaptive"]
    (chk,) = checks.values() if isinstance(checks, dict) else checks
    assert chk["rc"] == 0, chk
    want = grid.overlay_policy.parse_policy("adaptive:auto:520", 64, "t").describe()
    assert want != grid.overlay_policy.parse_policy("adaptive", 64, "t").describe()
    assert f"policy {want} (budget 64)" in chk["policy_line"], chk["policy_line"]
    assert "1:0,3,7,15,31,47,64;16:" in want  # budget 64 offered up to bs 15 (8 x 65 = 520)


def test_freeze_gc_reaches_every_bench_and_pins_the_out(tmp_path):
    """--freeze-gc: every level's bench gets --freeze-gc (the stand-in logs each real
    gc.freeze()); a grid measured with it resumes only with it, and one without keeps its
    settings as before."""
    out = tmp_path / "o"
    r = _run("--out", str(out), "--site", f"{STANDIN}{os.pathsep}{REPO / 'src'}", "--port",
             str(_free_port()), "--levels", "1,2", "--requests-per-level", "4",
             "--prompts-per-regime", "2", "--regimes", "absent", "--modes", "none",
             "--freeze-gc", "--keep-records")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert res["settings"]["freeze_gc"] is True
    benches = sorted(out.glob("bench-*.json"))
    assert len(benches) == 2
    assert all("--freeze-gc" in json.loads(b.read_text())["argv"] for b in benches)
    logs = "".join(p.read_text() for p in out.glob("**/*.log"))
    # once by serve when the server is ready (freezeGc, on by default), once per level
    assert logs.count("froze SGLang's garbage collectors after its warm-up") == 1
    assert logs.count("Freezing GC in Scheduler process") == 1 + 2
    plain = ["--out", str(out), "--site", str(REPO / "src"), *TINY]
    with pytest.raises(grid.UsageError, match=r"other settings \(freeze_gc\)"):
        grid.setup(grid.build_parser().parse_args(plain), plain)
    other = ["--out", str(tmp_path / "p"), "--site", str(REPO / "src"), *TINY]
    assert "freeze_gc" not in grid.setup(grid.build_parser().parse_args(other),
                                          other).opts.settings


def test_padded_verify_reaches_the_ddtree_servers_only_and_pins_the_out(tmp_path):
    """--padded-verify: every DDTree server plans FlashInfer from the bound with its drafter on
    Triton, the way the launcher accepts it; DFLASH and none stay as they were; FlashInfer only;
    a grid measured with it resumes only with it."""
    from sglang_dflash.config import parse_config

    out = tmp_path / "o"
    argv = ["--out", str(out), "--site", str(REPO / "src"), *TINY, "--padded-verify"]
    g = grid.setup(grid.build_parser().parse_args(argv), argv)
    assert g.opts.settings["padded_verify"] is True
    by_label = {m.label: m for m in g.opts.modes}
    ddtree = grid.server_config(g.opts, "a", by_label["ddtree-adaptive"])
    assert ddtree["environment"][grid.overlay_settings.HOST_LENS_ENV] == "bound"
    assert ddtree["attentionBackend"] == "flashinfer"
    assert ddtree["draftAttentionBackend"] == "triton"
    env = dict(parse_config(ddtree).environment)  # the launcher's rule holds
    assert env[grid.overlay_settings.HOST_LENS_ENV] == "bound"
    for label in ("dflash", "none"):
        if label in by_label:
            cfg = grid.server_config(g.opts, label, by_label[label])
            assert grid.overlay_settings.HOST_LENS_ENV not in cfg.get("environment", {})
            assert cfg.get("draftAttentionBackend") in (None, "flashinfer")
    g.save()
    plain = ["--out", str(out), "--site", str(REPO / "src"), *TINY]
    with pytest.raises(grid.UsageError, match=r"other settings \(padded_verify\)"):
        grid.setup(grid.build_parser().parse_args(plain), plain)
    tri = ["--out", str(tmp_path / "t"), "--site", str(REPO / "src"), *TINY,
           "--backend", "triton", "--padded-verify"]
    with pytest.raises(grid.UsageError, match="needs --backend flashinfer"):
        grid.setup(grid.build_parser().parse_args(tri), tri)


def test_max_running_requests_reaches_the_speculative_servers_only_and_pins_the_out(tmp_path):
    """--max-running-requests: SGLang's DFLASH hook resets an unset one to 48, so every
    speculative server (dflash, ddtree-*) gets it set and none keeps SGLang's default; without
    the flag no server has the key; a grid measured with one N resumes only with that N."""
    from sglang_dflash.config import parse_config, render_argv

    out = tmp_path / "o"
    argv = ["--out", str(out), "--site", str(REPO / "src"), *TINY,
            "--max-running-requests", "64"]
    g = grid.setup(grid.build_parser().parse_args(argv), argv)
    assert g.opts.settings["max_running_requests"] == 64
    by_label = {m.label: m for m in g.opts.modes}
    for label in ("dflash", "ddtree-8", "ddtree-adaptive"):
        cfg = grid.server_config(g.opts, label, by_label[label])
        assert cfg["maxRunningRequests"] == 64, label
        rendered = render_argv(parse_config(cfg))  # the launcher takes it
        assert rendered[rendered.index("--max-running-requests") + 1] == "64"
    none = grid.server_config(g.opts, "none", by_label["none"])
    assert "maxRunningRequests" not in none
    assert "--max-running-requests" not in render_argv(parse_config(none))
    g.save()
    for resume in (["--max-running-requests", "32"], []):
        again = ["--out", str(out), "--site", str(REPO / "src"), *TINY, *resume]
        with pytest.raises(grid.UsageError, match=r"other settings \(max_running_requests\)"):
            grid.setup(grid.build_parser().parse_args(again), again)
    plain = ["--out", str(tmp_path / "p"), "--site", str(REPO / "src"), *TINY]
    g2 = grid.setup(grid.build_parser().parse_args(plain), plain)
    assert "max_running_requests" not in g2.opts.settings
    for label, mode in by_label.items():
        assert "maxRunningRequests" not in grid.server_config(g2.opts, label, mode), label
    g2.save()  # a grid without it resumes only without it
    again = ["--out", str(tmp_path / "p"), "--site", str(REPO / "src"), *TINY,
             "--max-running-requests", "64"]
    with pytest.raises(grid.UsageError, match=r"other settings \(max_running_requests\)"):
        grid.setup(grid.build_parser().parse_args(again), again)
