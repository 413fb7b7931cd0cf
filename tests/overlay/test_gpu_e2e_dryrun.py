"""Dry run of scripts/gpu_e2e.py against the SGLang stand-in, so the GPU call cannot die on a typo.

The stand-in ignores plants, DDTree and SGLANG_SIMULATE_ACC_LEN, so only the flow and the JSON
shape are asserted: real `sglang-dflash serve` processes, `check --url`, greedy requests, the
plant file, the CPU oracle, benches, results.json after every step, errors recorded and the
next step still run, the time budget. `check` and `break` need a real SGLang site: not here.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.script_module import load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_e2e.py"
SITE = os.pathsep.join([str(REPO / "tests" / "standin"), str(REPO / "src")])


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out"
    env = dict(os.environ, STANDIN_TOKEN_DELAY="0")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--models", str(tmp_path / "models"),
         "--site", SITE, *args],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads((out / "results.json").read_text())


def test_full_flow_against_standin(tmp_path):
    proc, res = _run(
        tmp_path, "--bench-prompts", "planted", "--bench-concurrency", "1,2",
        "--bench-num-prompts", "4",
        "serve:none", "plant:16", "plant:64", "simacc:x", "simacc:4", "serve:ddtree:16", "nope",
    )  # fmt: skip
    out = tmp_path / "out"
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(summary["errors"]) == {"simacc:x", "nope"}, summary["errors"]
    assert res["steps"][-1] == "nope" and "elapsed_s" in res

    none = res["serve"]["serve:none"]
    assert none["ready_seconds"] and none["serve_exit"] is not None
    # serve's own lines: it saw the server ready (the stand-in's /health takes SGLang's second)
    # and froze its collectors (gpu-results.md §33: no GPU run before had either)
    lines = none["serve_lines"]
    assert lines["ready"] is True and lines["froze"] is True, lines
    assert any(ln.startswith("sglang-dflash serve: ready after") for ln in lines["lines"])
    assert len(none["continuations"]) == 6 and all(none["continuations_extend_greedy"])
    assert len(none["continuations"][0]) == 64 + 16 + 1
    assert none["bench"]["rc"] == 0 and none["bench"]["prompts"] == "planted"
    assert res["compare"]["identical"] is True
    assert res["compare"]["compared"] == ["serve:none", "serve:ddtree:16"]

    plant = res["plant"]["plant:16"]
    assert plant["check_url"]["rc"] == 0, plant["check_url"]["stdout"]
    doc = json.loads((out / "plant-16.json").read_text())
    assert doc["test_only"] is True and len(doc["requests"]) == 6
    cfg = json.loads((out / "config-plant-16.json").read_text())
    assert cfg["algorithm"] == "ddtree" and cfg["ddtree"] == {"budget": 16}
    assert cfg["environment"]["SGLANG_DFLASH_DDTREE_PLANT"] == str(out / "plant-16.json")
    assert cfg["environment"]["SGLANG_DFLASH_DDTREE_PROFILE"].endswith("profile-plant-16.jsonl")
    rows = plant["rows"]
    assert rows[0]["schedule"] == "absent" and rows[-1]["schedule"] == "chain"
    for row, req in zip(rows, doc["requests"], strict=True):
        assert row["input_ids"] == req["input_ids"]
        assert row["identical"] is True and row["first_diff"] is None
        assert row["oracle_verify_ct"] == len(row["oracle_rounds"])
        assert isinstance(row["verify_ct_matches"], bool) and row["verify_ct"] >= 1
    s = plant["summary"]
    assert s["all_identical"] is True and isinstance(s["all_verify_ct_match_oracle"], bool)
    assert set(s["accept_length_by_schedule"]) == {r["schedule"] for r in rows}
    assert plant["bench"]["rc"] == 0 and (out / "bench-plant-16.json").exists()
    assert isinstance(plant["profile"], list)  # the stand-in has no worker: empty

    sim = res["simacc"]["simacc:4"]
    assert len(sim["accept_lengths"]) == 4 and sim["config"]["algorithm"] == "dflash"
    assert sim["config"]["environment"] == {"SGLANG_SIMULATE_ACC_LEN": "4"}
    assert "ValueError" in res["simacc:x"]["error"] and "simacc:x" not in res["simacc"]

    # The CPU oracle builds the planted trees with the DDTree core: torch.
    if importlib.util.find_spec("torch") is None:
        pytest.skip("the plant oracle needs torch (the DDTree core); the rest of the flow passed")
    assert "oracle_error" not in plant, plant.get("oracle_error")
    # The oracle's own spread: all absent accepts nothing, an all-rank-0 chain the most.
    assert rows[0]["oracle_accept_length"] < 1.1 < rows[-1]["oracle_accept_length"]
    assert s["oracle_exact"] is True and plant["oracle_boundary_margin"] > 1e-3
    assert res["plant"]["plant:64"]["summary"]["oracle_exact"] is False  # ties at 64
    # The chain accepts only spine drafts; some schedule accepts a branch off it.
    assert set(rows[-1]["oracle_accepted_by_rank"]) == {"0"}
    assert any(set(r["oracle_accepted_by_rank"]) - {"0"} for r in rows)


def test_plant_without_none_run_and_time_budget(tmp_path):
    _, res = _run(tmp_path, "--no-bench", "plant:8")
    assert "serve:none" in res["plant"]["plant:8"]["error"]
    _, res = _run(tmp_path, "--no-bench", "--time-budget-s", "5", "serve:none", "plant:8")
    assert "time budget" in res["serve:none"]["skipped"]
    assert "time budget" in res["plant:8"]["skipped"] and res["serve"] == {}


def test_sample_steps_against_standin(tmp_path):
    """`sample:<N>[:noplant][:flashinfer]`: T > 0 first, plant or not, the backend flag."""
    proc, res = _run(
        tmp_path, "--no-bench", "sample:64", "serve:none", "sample:16", "sample:56:noplant",
        "sample:56:noplant:flashinfer", "sample:16:bogus",
    )  # fmt: skip
    out = tmp_path / "out"
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    samples = res["sample"]
    # a planted sample step before serve:none has no continuations to plant
    assert "serve:none" in samples["sample:64"]["error"]
    planted = samples["sample:16"]
    assert planted["plant_file"] == str(out / "sample-16.json")
    assert json.loads((out / "sample-16.json").read_text())["test_only"] is True
    for step in ("sample:16", "sample:56:noplant", "sample:56:noplant:flashinfer"):
        rec = samples[step]
        smoke = rec["sampling_smoke"]
        assert smoke["temperature"] == 0.8 and smoke["all_full_length"] is True, smoke
        assert len(smoke["requests"]) == 6 and rec["alive_after"] is True
        assert isinstance(rec["flashinfer_sampling_before"], list)
    noplant = json.loads((out / "config-sample-56-noplant.json").read_text())
    assert "SGLANG_DFLASH_DDTREE_PLANT" not in noplant["environment"]
    assert noplant["extraArgs"][:2] == ["--sampling-backend", "pytorch"]
    fi = json.loads((out / "config-sample-56-noplant-flashinfer.json").read_text())
    assert fi["extraArgs"][:2] == ["--sampling-backend", "flashinfer"]
    assert "unknown sample flag" in samples["sample:16:bogus"]["error"]
    assert set(summary["errors"]) == {"sample:64", "sample:16:bogus"}


def test_backend_suffix_and_reuse(tmp_path):
    """`step@backend` runs that step on another attention backend; `--reuse` replants later."""
    proc, res = _run(
        tmp_path, "--no-bench", "serve:none", "serve:none@triton", "plant:16@triton",
        "serve:ddtree:16@triton", "serve:ddtree:16", "plant:8@bogus",
    )  # fmt: skip
    out = tmp_path / "out"
    cfg = json.loads((out / "config-none-triton.json").read_text())
    assert cfg["attentionBackend"] == "triton"
    cfg = json.loads((out / "config-plant-16-triton.json").read_text())
    assert (cfg["attentionBackend"], cfg["draftAttentionBackend"]) == ("triton", "triton")
    assert cfg["environment"]["SGLANG_DFLASH_DDTREE_PLANT"] == str(out / "plant-16-triton.json")
    assert json.loads((out / "config-ddtree-16.json").read_text())["attentionBackend"] == (
        "flashinfer")
    assert res["plant"]["plant:16@triton"]["summary"]["all_identical"] is True
    # each backend compared among itself
    assert res["compare"]["compared"] == ["serve:none", "serve:ddtree:16"]
    assert res["compare"]["by_backend"]["triton"]["compared"] == [
        "serve:none@triton", "serve:ddtree:16@triton"]
    assert res["compare"]["by_backend"]["triton"]["identical"] is True
    assert "unknown backend 'bogus'" in res["plant:8@bogus"]["error"]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(summary["errors"]) == {"plant:8@bogus"}

    # A later call replants from the first call's serve:none without starting it again.
    first = out / "results.json"
    out2 = tmp_path / "out2"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out2), "--models", str(tmp_path / "models"),
         "--site", SITE, "--no-bench", "--reuse", str(first), "plant:8", "plant:8@triton"],
        capture_output=True, text=True, timeout=240,
        env=dict(os.environ, STANDIN_TOKEN_DELAY="0"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    res2 = json.loads((out2 / "results.json").read_text())
    assert res2["serve"]["serve:none"]["reused_from"] == str(first)
    for step in ("plant:8", "plant:8@triton"):
        assert res2["plant"][step]["summary"]["all_identical"] is True, res2["plant"][step]
    assert not (out2 / "serve-none.log").exists()  # no new serve:none start


def test_seeded_step_against_standin(tmp_path):
    """`seeded:<N>`: two deterministic-inference servers, the DDTree one planted with the
    no-spec run's seeded outputs; flow and JSON shape only (the stand-in ignores seeds)."""
    proc, res = _run(tmp_path, "--no-bench", "seeded:16", "seeded:x")
    out = tmp_path / "out"
    rec = res["seeded"]["seeded:16"]
    for name in ("config-seeded-none.json", "config-seeded-16.json"):
        cfg = json.loads((out / name).read_text())
        assert "--enable-deterministic-inference" in cfg["extraArgs"], cfg
    ddcfg = json.loads((out / "config-seeded-16.json").read_text())
    assert ddcfg["environment"]["SGLANG_DFLASH_DDTREE_PLANT"] == str(out / "seeded-16.json")
    assert len(rec["none"]["outputs"]) == 6 and len(rec["none"]["greedy"]) == 6
    assert len(rec["ddtree"]["rows"]) == 6
    assert rec["summary"]["all_identical"] is True, rec["summary"]
    assert isinstance(rec["summary"]["sampled"], bool)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "seeded:x" in summary["errors"]


def test_curve_benches_each_schedule(tmp_path):
    """`--curve`: one short bench per plant schedule, its one prompt at concurrency 1 and 8."""
    proc, res = _run(tmp_path, "--no-bench", "--curve", "serve:none", "plant:16")
    curve = res["plant"]["plant:16"]["curve"]
    assert [c["schedule"] for c in curve] == ["absent", "sparse", "mixed", "branchy",
                                               "mostly0", "chain"]
    for c in curve:
        assert c["rc"] == 0 and c["tok_s_c1"] > 0 and c["tok_s_c8"] > 0, c
        assert c["oracle_accept_length"] >= 1.0
    lines = (tmp_path / "out" / "curve-plant-16-chain.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["input_ids"]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(summary["curve"]["plant:16"]) == 6


def test_trace_step_against_standin(tmp_path):
    """`trace:<N>`: a DDTree server with the tracing environment and benches at rising
    concurrency; the stand-in writes no traces, so only the config, flow and shape count."""
    proc, res = _run(tmp_path, "trace:16", "trace:x")
    out = tmp_path / "out"
    cfg = json.loads((out / "config-trace-16.json").read_text())
    env = cfg["environment"]
    assert env["SGLANG_DFLASH_DDTREE_TRACE"] == str(out / "trace-16")
    assert env["SGLANG_DFLASH_DDTREE_TRACE_MAX"] == "16"
    assert env["SGLANG_DFLASH_DDTREE_PROFILE"] == str(out / "profile-trace-16.jsonl")
    rec = res["trace"]["trace:16"]
    assert rec["ready_seconds"] and rec["bench"]["rc"] == 0, rec.get("bench")
    bench = json.loads((out / "bench-trace-16.json").read_text())
    assert [s["concurrency"] for s in bench["summaries"]] == [1, 2, 4, 8, 13, 32]
    assert rec["traces"] == [] and rec["trace_files"] == []
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "trace:x" in summary["errors"] and summary["trace"]["trace:16"] == []


def _gpu_e2e():
    return load_script(SCRIPT, "gpu_e2e_under_test")


def test_a_port_that_already_answers_is_not_a_ready_server(tmp_path):
    """A stale server on the port (an interrupted run's) must not be taken for the new one:
    the start is refused with the reason, nothing is started, nothing is benched."""
    import http.server
    import socket
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stale = http.server.HTTPServer(("127.0.0.1", port), Health)
    threading.Thread(target=stale.serve_forever, daemon=True).start()
    try:
        e2e = _gpu_e2e()
        out = tmp_path / "out"
        out.mkdir()
        opts = e2e.Opts(out=out, env=dict(os.environ), models=(tmp_path, tmp_path),
                        backend="triton", bench=False, bench_prompts="planted",
                        bench_concurrency="1", bench_num_prompts=1, clock=e2e.Clock(60))
        cfg = {"port": port, "startTimeout": 30}
        with e2e.running_server(opts, cfg, "x") as (_url, rec):
            assert rec["ready_seconds"] is None
            assert "port busy" in rec["error"] and "pid" not in rec
        assert not (out / "serve-x.log").exists()  # no serve process was started
    finally:
        stale.shutdown()


def test_a_port_still_held_is_waited_for_then_refused():
    """A server of a killed call can hold the port (listening, not answering /health) for a
    few seconds: the next start waits for it to close, and gives up after the limit."""
    import socket
    import threading

    e2e = _gpu_e2e()
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        assert e2e.wait_port_free(port, limit_s=0.6) is None
        threading.Timer(1.0, held.close).start()
        waited = e2e.wait_port_free(port, limit_s=20)
        assert waited is not None and 0.5 <= waited < 20
    finally:
        held.close()
    assert e2e.wait_port_free(port, limit_s=0) == 0.0


def test_seeded_adaptive_step_checks_batches_and_reads_the_policy(tmp_path):
    """`seeded:adaptive:<N>`: the DDTree server runs the adaptive policy, the seeded outputs
    are also compared in batches of 8 and 32 requests, and the policy's state is read after
    each (the stand-in's /server_info has no DDTree state; the flow still runs)."""
    proc, res = _run(tmp_path, "--no-bench", "--nodraft-steps", "8", "seeded:adaptive:16",
                     "seeded:adaptive:x")
    out = tmp_path / "out"
    rec = res["seeded"]["seeded:adaptive:16"]
    cfg = json.loads((out / "config-seeded-adaptive-16.json").read_text())
    assert cfg["ddtree"] == {"budget": 16, "policy": "adaptive"}
    # the k-step no-draft round reaches the adaptive server (and only it)
    assert cfg["environment"]["SGLANG_DFLASH_DDTREE_NODRAFT_STEPS"] == "8"
    none_cfg = json.loads((out / "config-seeded-none.json").read_text())
    assert "SGLANG_DFLASH_DDTREE_NODRAFT_STEPS" not in none_cfg.get("environment", {})
    assert rec["nodraft_steps"] == 8
    assert "--enable-deterministic-inference" in cfg["extraArgs"]
    assert [b["concurrency"] for b in rec["ddtree"]["batches"]] == [8, 32]
    for b in rec["ddtree"]["batches"]:
        assert len(b["first_diff"]) == b["concurrency"] and b["identical"] is True
        assert "policy" in b
    assert rec["summary"]["all_identical"] is True
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "seeded:adaptive:x" in summary["errors"]


def test_parse_seeded():
    e2e = _gpu_e2e()
    assert e2e.parse_seeded("seeded:56") == (56, False)
    assert e2e.parse_seeded("seeded:adaptive:16") == (16, True)
    for bad in ("seeded:x", "seeded:adaptive", "seeded:fixed:16", "seeded:0"):
        with pytest.raises(ValueError):
            e2e.parse_seeded(bad)


def test_the_scripts_nodraft_variable_is_the_overlays():
    """gpu_e2e runs outside the package; its copy of the variable name must be the one the
    worker reads."""
    from sglang_dflash.sglang_overlay import settings

    assert _gpu_e2e().NODRAFT_STEPS_ENV == settings.NODRAFT_STEPS_ENV
    assert _gpu_e2e().DEFAULT_NODRAFT_STEPS == settings.DEFAULT_NODRAFT_STEPS


def test_serve_lines_say_what_serve_saw():
    e2e = _gpu_e2e()
    log = ("[2026-12-06 07:26:44] The server is fired up and ready to roll!\n"
           "sglang-dflash serve: froze SGLang's garbage collectors after its warm-up "
           "(freezeGc; POST /freeze_gc)\n"
           "sglang-dflash serve: ready after 61.2s: serving m (ddtree) on 127.0.0.1:30000\n"
           "INFO: GET /health 200\n")
    got = e2e.serve_lines(log)
    assert got["ready"] and got["froze"] and len(got["lines"]) == 2
    # §33's logs: only the stop line (serve never saw the server ready)
    old = e2e.serve_lines("sglang-dflash serve: SGLang ended its shutdown with SIGKILL (as "
                          "0.5.17 does after SIGTERM); treating the stop as clean\n")
    assert old["ready"] is False and old["froze"] is False and len(old["lines"]) == 1


def _answers(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def test_a_server_left_by_a_killed_run_is_stopped_by_the_next_start(tmp_path):
    """gpu-results.md §34: a call killed at its limit left its server running (its own session:
    the device tool does not end it); it bound the port under the next call's server, which
    then 'answered'. Now the next start on that port stops the group the killed run noted."""
    import signal
    import time

    e2e = _gpu_e2e()
    registry = tmp_path / "registry"
    env = dict(os.environ, STANDIN_TOKEN_DELAY="0.05", **{e2e.REGISTRY_ENV: str(registry)})
    first = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "o1"), "--models",
         str(tmp_path / "models"), "--site", SITE, "--no-bench", "serve:none"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    note = registry / str(e2e.PORT)
    pgid = None
    try:
        deadline = time.monotonic() + 120
        while not (note.exists() and _answers(e2e.PORT)):
            assert first.poll() is None and time.monotonic() < deadline, "first run ended early"
            time.sleep(0.2)
        pgid, starter = (int(x) for x in note.read_text().split())
        assert starter == first.pid
        first.send_signal(signal.SIGKILL)  # the caller dies; its server does not
        first.wait(timeout=30)
        time.sleep(0.5)
        assert _answers(e2e.PORT), "the killed run's server should still be serving"
        _, res = _run(tmp_path, "--no-bench", "serve:none")  # no registry env: must not reap
        assert "port busy" in res["serve"]["serve:none"]["error"]
        env2 = dict(os.environ, STANDIN_TOKEN_DELAY="0", **{e2e.REGISTRY_ENV: str(registry)})
        second = subprocess.run(
            [sys.executable, str(SCRIPT), "--out", str(tmp_path / "o2"), "--models",
             str(tmp_path / "models"), "--site", SITE, "--no-bench", "serve:none"],
            env=env2, capture_output=True, text=True, timeout=240)
        assert second.returncode == 0, second.stderr[-3000:]
        rec = json.loads((tmp_path / "o2" / "results.json").read_text())["serve"]["serve:none"]
        assert rec["reaped_stale_group"] == pgid and rec["ready_seconds"], rec
        assert rec["serve_lines"]["ready"] is True
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)
        assert not note.exists()  # the second run's own entry is gone with its server
    finally:
        if first.poll() is None:
            first.kill()
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, 9)


def test_ready_is_what_serve_said(tmp_path):
    e2e = _gpu_e2e()
    log = tmp_path / "serve.log"
    assert e2e.serve_said_ready(log) is False  # no log yet
    log.write_text("[x] The server is fired up and ready to roll!\n")
    assert e2e.serve_said_ready(log) is False  # SGLang's line is not serve's
    log.write_text(log.read_text() + "sglang-dflash serve: ready after 3.1s: serving m\n")
    assert e2e.serve_said_ready(log) is True


def test_a_live_runs_server_is_not_reaped(tmp_path):
    """The registry names the starter: a group whose starter still runs (another run on this
    machine) is left alone; once the starter is gone it is stopped."""
    e2e = _gpu_e2e()
    registry = tmp_path / "registry"
    starter = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    group = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        registry.mkdir()
        (registry / "31999").write_text(f"{group.pid} {starter.pid}\n")
        assert e2e.reap_stale(registry, 31999) is None and group.poll() is None
        assert (registry / "31999").exists()
        starter.kill()
        starter.wait()
        assert e2e.reap_stale(registry, 31999) == group.pid
        assert group.wait(timeout=10) == -9 and not (registry / "31999").exists()
        (registry / "31999").write_text(f"{group.pid} {starter.pid}\n")  # both gone now
        assert e2e.reap_stale(registry, 31999) is None and not (registry / "31999").exists()
    finally:
        for p in (starter, group):
            if p.poll() is None:
                p.kill()


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan waits for init to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_an_interrupted_run_leaves_no_server_even_one_stuck_in_its_exit(tmp_path):
    """SIGINT to the harness while it benches (a call's `timeout -s INT`): the server is gone
    before `timeout`'s SIGKILL margin (15 s) even when SGLang ignores SIGTERM, stuck in its
    graceful exit; serve alone would only SIGTERM it (PDEATHSIG) and leave it serving."""
    import signal
    import time

    e2e = _gpu_e2e()
    env = dict(os.environ, STANDIN_TOKEN_DELAY="0.05", STANDIN_STUCK_ON_TERM="1",
               **{e2e.REGISTRY_ENV: str(tmp_path / "registry")})
    run = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "o"), "--models",
         str(tmp_path / "models"), "--site", SITE, "--no-bench", "serve:none"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    note = tmp_path / "registry" / str(e2e.PORT)
    tree: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while not (note.exists() and _answers(e2e.PORT)):
            assert run.poll() is None and time.monotonic() < deadline, "run ended early"
            time.sleep(0.2)
        from sglang_dflash.portowner import process_tree
        tree = process_tree(int(note.read_text().split()[0]))
        assert len(tree) >= 2  # serve and the stand-in, each in its own group
        t0 = time.monotonic()
        run.send_signal(signal.SIGINT)
        run.wait(timeout=60)
        assert time.monotonic() - t0 < 15, "stopping took past timeout's kill margin"
        time.sleep(0.5)
        assert not _answers(e2e.PORT)
        deadline = time.monotonic() + 5
        while [pid for pid in tree if _running(pid)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in tree if _running(pid)]
    finally:
        if run.poll() is None:
            run.kill()
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
