"""`python -m router_pair.router_pair` (the H200 router pair, issue 17 item 5) end to end on the
CPU: the stand-in SGLang server under `sglang-dflash serve` for the reference and both pair
servers, and smg 1.13.0's real router binary under `sglang-dflash router`, as in
test_router_live.py. results.json must show greedy identity router vs reference, every request
counted, both servers served, `check --url` through the router passing; the judging helpers
must say no to a differing output, a lost request and a short one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, STANDIN, free_port
from tests.router.test_router_live import env

sys.path.insert(0, str(REPO / "benchmarks"))  # benchmarks/ has no __init__.py
from router_pair import router_pair as rp

pytest.importorskip("smg", reason="the router's wheel (pip install -e '.[router]') is missing")

C, PER_LEVEL, IDENTITY = 8, 4, 4


def run_pair(
    tmp: Path, *extra: str, out: str = "out", timeout: float = 240
) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp / out
    ports = ",".join(str(free_port()) for _ in range(3))
    argv = [
        sys.executable,
        "-m",
        "router_pair.router_pair",
        "--dummy",
        "--pair",
        str(tmp / "pair"),
        "--out",
        str(out),
        "--site",
        f"{STANDIN}:{REPO / 'src'}",
        "--ports",
        ports,
        "--router-port",
        str(free_port()),
        "--metrics-port",
        str(free_port()),
        "--concurrency",
        str(C),
        "--requests-per-level",
        str(PER_LEVEL),
        "--identity-prompts",
        str(IDENTITY),
        *extra,
    ]
    e = env(STANDIN_TOKEN_DELAY="0.001")
    e["PYTHONPATH"] = f"{REPO / 'src'}:{REPO / 'benchmarks'}"
    r = subprocess.run(argv, cwd=REPO, env=e, capture_output=True, text=True, timeout=timeout)
    path = out / "results.json"
    return r, (json.loads(path.read_text()) if path.exists() else {})


def test_router_pair_end_to_end_against_standins(tmp_path):
    r, res = run_pair(tmp_path)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    s = res["summary"]
    assert s["identical"] == {
        "router_sequential_vs_reference": True,
        "router_parallel_vs_reference": True,
        "reference_parallel_vs_sequential": True,
    }, s["identity"]
    rows = s["identity"]["router_parallel_vs_reference"]["rows"]
    assert len(rows) == IDENTITY and all(x["tokens"] == 256 for x in rows), rows
    n = C * PER_LEVEL
    for side in ("reference", "router"):
        assert s["counts"][f"{side}_bench"] == {
            "sent": n,
            "ok": n,
            "errors": 0,
            "ok_short": 0,
            "error_messages": [],
            "requested": n,
        }
        for kind in ("sequential", "parallel"):
            assert s["counts"][f"{side}_{kind}"] == {"sent": IDENTITY, "ok": IDENTITY, "errors": 0}
        assert s["tok_s"][side] and s["tok_s"][side] > 0
    assert s["all_accounted"] is True and s["errors"] == 0
    assert s["tok_s"]["ratio_router_over_reference"] > 0
    # the stand-in counts /generate only: the two servers served the bench and its warm-up
    served = s["router_bench_server_requests"]
    assert len(served) == 2 and s["both_servers_served"] is True, served
    assert sum(served.values()) == n + 1, served
    assert s["servers_cover_client"] is True
    assert s["check_url_rc"] == 0, res["router"]["check_url"]
    assert {k: s["check_url"][k] for k in ("generate", "speculation", "ddtree_budget")} == {
        "generate": "PASS",
        "speculation": "PASS",
        "ddtree_budget": "PASS",
    }
    servers = res["router"]["servers"]
    assert {k: v["config"]["memFractionStatic"] for k, v in servers.items()} == {
        "pair-a": 0.3,
        "pair-b": 0.3,
    }
    assert res["reference"]["config"]["memFractionStatic"] == 0.6
    for rec in (res["reference"], *servers.values()):
        assert "--enable-deterministic-inference" in rec["config"]["extraArgs"]
        assert rec["config"]["ddtree"] == {"budget": 16, "policy": "fixed"}
    assert res["router"]["router"]["readiness"]["healthy_workers"] == 2
    assert res["skipped"] == {} and "errors" not in res


def test_time_budget_skips_what_does_not_fit_and_reuse_finishes_it(tmp_path):
    r, res = run_pair(tmp_path, "--time-budget-s", "150", "--phases", "router,reference")
    assert r.returncode == 0, r.stderr[-2000:]
    assert res["phases"] == ["router", "reference"]
    assert "router" in res["skipped"] and "router" not in res
    assert "reference" not in res["skipped"] and res["reference"]["ready_seconds"]
    assert res["summary"]["identical"]["router_parallel_vs_reference"] is None
    # a second call: the router phase against the first call's reference
    first = tmp_path / "out" / "results.json"
    r, res = run_pair(tmp_path, "--reuse", str(first), out="out2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert res["reference"]["reused_from"] == str(first)
    s = res["summary"]
    assert s["identical"]["router_parallel_vs_reference"] is True, s["identity"]
    assert s["all_accounted"] is True and s["tok_s"]["ratio_router_over_reference"] > 0


def test_judges_say_no_to_a_differing_output_a_lost_and_a_short_request():
    ref = {"rows": [{"ok": True, "output": [1, 2, 3]}, {"ok": True, "output": [4, 5, 6]}]}
    same = {"rows": [{"ok": True, "output": [1, 2, 3]}, {"ok": True, "output": [4, 5, 6]}]}
    assert rp.compare_outputs(same, ref)["identical"] is True
    diff = {"rows": [{"ok": True, "output": [1, 2, 3]}, {"ok": True, "output": [4, 9, 6]}]}
    got = rp.compare_outputs(diff, ref)
    assert got["identical"] is False and got["rows"][1]["first_diff"] == 1
    lost = {"rows": [{"ok": True, "output": [1, 2, 3]}, {"ok": False, "error": "HTTP 502"}]}
    assert rp.compare_outputs(lost, ref)["identical"] is False
    assert rp.compare_outputs({"rows": same["rows"][:1]}, ref)["identical"] is False
    recs = [
        {"ok": True, "output_tokens": 8},
        {"ok": False, "error": "HTTP 502: bad gateway"},
        {"ok": True, "output_tokens": 5},
    ]
    counts = rp.count_records(recs, 8)
    assert counts == {
        "sent": 3,
        "ok": 2,
        "errors": 1,
        "ok_short": 1,
        "error_messages": ["HTTP 502: bad gateway"],
    }
    res = {
        "router": {
            "bench": {"counts": counts | {"requested": 3}, "warmup": 1},
            "server_requests": {"a": 3.0, "b": 0.0},
        }
    }
    s = rp.summarise(res)
    assert s["all_accounted"] is False and s["errors"] == 1
    assert s["both_servers_served"] is False and s["servers_cover_client"] is True
    res["router"]["bench"]["counts"]["ok_short"] = 0
    assert rp.summarise(res)["all_accounted"] is True
