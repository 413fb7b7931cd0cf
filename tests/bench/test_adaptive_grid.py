"""``benchmarks/adaptive_grid.py`` on the CPU: its pure parts, and the command end to end.

The command runs as a real process that starts real ``sglang-dflash serve`` processes; SGLang
cannot run here, so the SGLang stand-in (tests/standin) answers in its place, as in
tests/real_drafter/test_serve_pair.py. The stand-in ignores plants and SGLANG_SIMULATE_ACC_LEN
(its accept length is fixed), so only the flow, the files and the JSON are tested here.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
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


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, STANDIN_TOKEN_DELAY="0.0002",
               PYTHONPATH=os.pathsep.join([str(STANDIN), str(REPO / "src"),
                                           str(REPO / "benchmarks")]))
    env.pop("NOTIFY_SOCKET", None)
    return subprocess.run([sys.executable, "-m", "adaptive_grid", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def _grid_run(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return _run("--out", str(out), "--site", f"{STANDIN}{os.pathsep}{REPO / 'src'}",
                "--port", str(_free_port()), *TINY, *extra)


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


def test_time_estimates_scale_with_rounds_and_round_cost():
    """A level's estimate: the same mode's measurement scaled by accept length, another
    mode's scaled by round_cost too; the start from the slowest measured start."""
    g = grid.Grid.__new__(grid.Grid)
    g.opts = type("O", (), {"settings": {"adaptive_budget": 64}, "level_estimate_s": 20.0,
                            "start_estimate_s": 120.0})()
    g.results = {"linear_accept_length": {"absent": 1.0, "chain": 16.0},
                 "oracle_accept_length": {"chain": {"64": 16.0}}, "cells": {},
                 "none_levels": {}, "servers": {}}
    d64 = grid.parse_mode("ddtree-64", 64)
    assert g.level_estimate(d64, "absent", 8) == 20.0  # nothing measured yet
    assert g.start_estimate(d64) == 120.0
    g.results["none_levels"]["8"] = {"mode": "none", "concurrency": 8, "tok_s": 1.0,
                                     "seconds": 6.0, "accept_length": None}
    want = 1.2 * (2 + 4 * grid.round_cost(d64, 8) / grid.round_cost(grid.NONE, 8))
    assert g.level_estimate(d64, "absent", 8) == pytest.approx(want)
    g.results["cells"]["absent|ddtree-64|8"] = {"mode": "ddtree-64", "concurrency": 8,
                                                "tok_s": 1.0, "seconds": 34.0,
                                                "accept_length": 1.0}
    assert g.level_estimate(d64, "chain", 8) == pytest.approx(1.2 * (2 + 32 / 16))
    g.results["servers"] = {"none": [{"ready_seconds": 80.0}],
                            "ddtree-8": [{"ready_seconds": 95.0}]}
    assert g.start_estimate(d64) == 95.0 + grid.STOP_S
    assert g.start_estimate(grid.parse_mode("ddtree-adaptive", 64)) == \
        95.0 + grid.STOP_S + grid.ADAPTIVE_EXTRA_S
    assert g.start_estimate(grid.NONE) == 80.0 + grid.STOP_S
    assert grid.round_cost(grid.NONE, 1) < grid.round_cost(grid.DFLASH, 1) < \
        grid.round_cost(d64, 64)


# ---- the command against the stand-in -----------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One grid run and, with the same --out, a second one (resume)."""
    out = tmp_path_factory.mktemp("grid") / "out"
    first = _grid_run(out)
    assert first.returncode == 0, first.stderr[-3000:]
    res1 = json.loads((out / "results.json").read_text())
    grid1 = json.loads((out / "adaptive-grid.json").read_text())
    logs = {p.name: p.stat().st_mtime_ns for p in out.glob("serve-*.log")}
    export = out.parent / "export"
    second = _grid_run(out, "--export", str(export))
    assert second.returncode == 0, second.stderr[-3000:]
    return {"out": out, "export": export, "res1": res1, "grid1": grid1, "logs1": logs,
            "res2": json.loads((out / "results.json").read_text()),
            "grid2": json.loads((out / "adaptive-grid.json").read_text())}


def test_grid_schema_and_every_cell(runs):
    doc = runs["grid1"]
    assert set(doc) == {"cells", "commands", "machine", "targets", "linear_accept_length",
                        "greedy_identical"}
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
    assert cmds[0].split()[1:3] == ["-m", "adaptive_grid"]
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
    cell = runs["res1"]["cells"]["chain|ddtree-8|2"]
    assert cell["bench_json"] == "bench-ddtree-8-chain-c2.json" and cell["rc"] == 0
    assert cell["requests"] == cell["ok"] == 8


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
    for name in ("ddtree-8", "ddtree-adaptive"):
        assert cfg[name]["environment"] == {"SGLANG_DFLASH_DDTREE_PLANT": str(out / "plant.json")}
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
    assert res["checks"]["ddtree-8"]["absent"]["policy_line"].endswith(
        "policy fixed (budget 8)")
    assert res["policy_state"]["ddtree-adaptive"]["absent"]["budget"] == 64
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
