"""`sglang-dflash bench` as a user runs it: a real subprocess against stand-in servers."""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..conftest import free_port, standin_env, wait_for_port


def bench(*args: str, env: dict[str, str] | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang_dflash", "bench", *args],
                          env=env or standin_env(), capture_output=True, text=True,
                          timeout=timeout)


def popen_bench(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sglang_dflash", "bench", *args],
                            env=env or standin_env(), text=True, **kw)


def one_line_error(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def write_config(path: Path, **kw) -> Path:
    raw = {"name": "bench-test", "model": "standin-model", "draftModel": "standin-draft",
           "algorithm": "dflash", "port": free_port(), "preflight": False, **kw}
    path.write_text(json.dumps(raw))
    return path


def needs_serve() -> None:
    try:
        import sglang_dflash.serve  # noqa: F401
    except ImportError as e:
        pytest.skip(f"sglang_dflash.serve cannot be imported yet ({e}); --config needs it")


# ---------------------------------------------------------------- --url


def test_url_run_measures_every_request(standin_server, tmp_path):
    url = standin_server("--speculative-algorithm", "DFLASH", STANDIN_ACCEPT_LENGTH="4.0")
    out = tmp_path / "out.json"
    r = bench("--url", url, "--concurrency", "1,3", "--num-prompts", "6",
              "--max-new-tokens", "12", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr  # no progress bar when stderr is not a terminal
    doc = json.loads(out.read_text())
    assert doc["interrupted"] is False and doc["machine"]["hostname"]
    recs = doc["records"]
    assert len(recs) == 12 and all(x["ok"] for x in recs)
    assert sorted(x["concurrency"] for x in recs) == [1] * 6 + [3] * 6
    for x in recs:
        assert x["output_tokens"] == 12 and x["prompt_tokens"] == 128
        assert 0 < x["ttft"] < x["latency"]
        assert len(x["itl"]) == 11
        assert x["spec_accept_length"] == pytest.approx(4.0)
    assert [s["concurrency"] for s in doc["summaries"]] == [1, 3]
    for s in doc["summaries"]:
        assert s["ok"] == 6 and s["output_tokens"] == 72
        assert s["accept_length"] == pytest.approx(4.0)
        assert s["output_tokens_per_s"] == pytest.approx(72 / s["duration_s"])
    assert "4.00" in r.stdout and url in r.stdout
    assert doc["best"] == [] and "fastest per concurrency" not in r.stdout  # one config: no pick


def test_non_speculative_server_has_no_acceptance(standin_server, tmp_path):
    url = standin_server()
    out = tmp_path / "out.json"
    r = bench("--url", url, "--num-prompts", "2", "--max-new-tokens", "4", "--json", str(out),
              "--quiet")
    assert r.returncode == 0 and r.stderr == ""
    s = json.loads(out.read_text())["summaries"][0]
    assert s["accept_length"] is None and s["accept_rate"] is None


def test_prompt_file_and_per_prompt_lengths(standin_server, tmp_path):
    url = standin_server()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"text": "Hello, world"}\n{"input_ids": [5, 6, 7], "max_new_tokens": 5}\n')
    out = tmp_path / "out.json"
    r = bench("--url", url, "--prompts", str(prompts), "--max-new-tokens", "9",
              "--json", str(out))
    assert r.returncode == 0, r.stderr
    recs = sorted(json.loads(out.read_text())["records"], key=lambda x: x["prompt_index"])
    assert [(x["output_tokens"], x["prompt_tokens"]) for x in recs] == [(9, 12), (5, 3)]


def test_api_key_file_is_sent_as_bearer(standin_server, tmp_path):
    url = standin_server("--api-key", "s3cret")
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    ok = bench("--url", url, "--num-prompts", "2", "--max-new-tokens", "4",
               "--api-key-file", str(key))
    assert ok.returncode == 0, ok.stderr
    no = bench("--url", url, "--num-prompts", "2", "--max-new-tokens", "4", "--quiet")
    assert no.returncode == 1
    assert "401" in one_line_error(no.stderr) and "--api-key-file" in no.stderr


def test_unreachable_server_fails_fast_with_one_line():
    t0 = time.monotonic()
    r = bench("--url", f"http://127.0.0.1:{free_port()}", "--quiet")
    assert r.returncode == 1
    assert "cannot reach" in one_line_error(r.stderr)
    assert time.monotonic() - t0 < 15


def test_server_dying_mid_run_stops_with_one_line(standin_server, tmp_path):
    url = standin_server("--speculative-algorithm", "DFLASH", STANDIN_DIE_AFTER_REQUESTS="4")
    out = tmp_path / "out.json"
    r = bench("--url", url, "--num-prompts", "20", "--max-new-tokens", "8", "--warmup", "0",
              "--concurrency", "1,2", "--json", str(out), "--quiet")
    assert r.returncode == 1
    err = one_line_error(r.stderr)
    assert "stopped at concurrency 1 after 4 completed requests" in err
    # the reason is named: refused or reset, a pipe broken while the request was being sent
    # (the server closed mid-send: seen on a loaded CI machine), or (if the dying server had
    # accepted the next request) a stream that ended early
    assert re.search(r"Connection\w*Error|BrokenPipeError|RemoteDisconnected|stream ended before",
                     err), err
    doc = json.loads(out.read_text())
    assert [x["ok"] for x in doc["records"]] == [True] * 4 + [False]
    assert doc["configs"][0]["error"].startswith("stopped at concurrency 1")
    assert err.startswith(f"sglang-dflash bench: {url}: stopped")
    assert [s["concurrency"] for s in doc["summaries"]] == [1]  # level 2 never ran


def test_request_timeout_bounds_each_request(standin_server, tmp_path):
    url = standin_server(STANDIN_TOKEN_DELAY="0.1")  # 50 tokens: 5 s per request
    out = tmp_path / "out.json"
    t0 = time.monotonic()
    r = bench("--url", url, "--num-prompts", "2", "--max-new-tokens", "50", "--warmup", "0",
              "--request-timeout", "0.5", "--json", str(out), "--quiet")
    assert time.monotonic() - t0 < 5
    assert r.returncode == 1
    assert "2 request(s) failed" in one_line_error(r.stderr)
    recs = json.loads(out.read_text())["records"]
    assert [x["error"] for x in recs] == ["timed out after 0.5 s (--request-timeout)"] * 2
    assert "0/2" in r.stdout


@pytest.mark.parametrize("argv, reason", [
    (["--url", "ftp://x"], "expected http"),
    (["--url", "http://127.0.0.1:1", "--concurrency", "0,8"], "--concurrency"),
    (["--url", "http://127.0.0.1:1", "--concurrency", "8,x"], "--concurrency"),
    (["--url", "http://127.0.0.1:1", "--sweep", "ddtree.budget=16"], "--sweep needs --config"),
    (["--url", "http://127.0.0.1:1", "--prompts", "/nonexistent.jsonl"], "cannot read"),
    (["--url", "http://127.0.0.1:1", "--api-key-file", "/nonexistent"], "API key file"),
    (["--url", "http://127.0.0.1:1", "--json", "/nonexistent/dir/o.json"], "does not exist"),
    (["--url", "http://127.0.0.1:1", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["--url", "http://127.0.0.1:1", "--log-dir", "/proc/no/such"], "--log-dir"),
    (["--config", "/nonexistent.json"], "cannot read config"),
    (["--config", "CFG", "--sweep", "ddtree.budget=16,0"], "ddtree.budget"),
    (["--config", "CFG", "--sweep", "ddtree.budget"], "KEY=VALUE"),
    (["--config", "CFG", "--sweep", "colour=red"], "colour"),
    (["--config", "CFG", "--sweep", "algorithm=dflash,ddtree", "--baseline", "algorithm=none"],
     "no configuration"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, argv, reason):
    cfg = write_config(tmp_path / "cfg.json")
    argv = [str(cfg) if a == "CFG" else a for a in argv]
    r = bench(*argv)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert reason in one_line_error(r.stderr)


def test_a_configs_unreadable_key_file_is_refused_before_any_start(tmp_path):
    cfg = write_config(tmp_path / "cfg.json", apiKeyFile=str(tmp_path / "missing-key"))
    r = bench("--config", str(cfg), "--sweep", "ddtree.budget=16,32")
    assert r.returncode == 2
    assert "cannot read API key file" in one_line_error(r.stderr)


def test_plot_without_matplotlib_is_a_usage_error(standin_server, tmp_path):
    blocker = tmp_path / "block" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('blocked for this test')\n")
    env = standin_env()
    env["PYTHONPATH"] = os.pathsep.join([str(blocker.parent), env["PYTHONPATH"]])
    r = bench("--url", "http://127.0.0.1:1", "--plot", str(tmp_path / "p.png"), env=env)
    assert r.returncode == 2
    assert "--plot needs matplotlib" in one_line_error(r.stderr)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_writes_partial_json_and_exits_130(standin_server, tmp_path, sig):
    url = standin_server(STANDIN_TOKEN_DELAY="0.02")  # ~0.4 s per request
    out = tmp_path / "out.json"
    p = popen_bench("--url", url, "--num-prompts", "50", "--max-new-tokens", "20",
                    "--warmup", "0", "--json", str(out), stderr=subprocess.PIPE,
                    stdout=subprocess.PIPE)
    time.sleep(3.0)
    p.send_signal(sig)
    stdout, stderr = p.communicate(timeout=15)
    assert p.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    doc = json.loads(out.read_text())
    assert doc["interrupted"] is True
    assert 1 <= len(doc["records"]) < 50
    assert all(x["ok"] for x in doc["records"])
    assert "ok/n" in stdout  # the partial table is printed too


def test_progress_bar_only_on_a_terminal(standin_server):
    url = standin_server(STANDIN_TOKEN_DELAY="0.01")
    master, slave = pty.openpty()
    p = popen_bench("--url", url, "--num-prompts", "6", "--max-new-tokens", "20",
                    stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 20)
        try:
            data = os.read(master, 4096) if ready else b""
        except OSError:  # EIO: the child closed the terminal
            data = b""
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert p.wait(10) == 0
    tty = b"".join(chunks).decode()
    assert "\r" in tty and "c=1 [" in tty and "/6 " in tty


# ---------------------------------------------------------------- --config (through serve)


def test_sweep_starts_one_server_per_point(tmp_path):
    needs_serve()
    cfg = write_config(tmp_path / "cfg.json")
    port = json.loads(cfg.read_text())["port"]
    out, png = tmp_path / "out.json", tmp_path / "out.png"
    has_mpl = importlib.util.find_spec("matplotlib") is not None  # else --plot is refused
    r = bench("--config", str(cfg), "--sweep", "algorithm=none,ddtree",
              "--sweep", "ddtree.budget=16,32", "--baseline", "algorithm=none",
              "--num-prompts", "3", "--max-new-tokens", "6", "--concurrency", "1,2",
              "--json", str(out), *(["--plot", str(png)] if has_mpl else []), timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    labels = [c["label"] for c in doc["configs"]]
    # algorithm=none ignores the budget: its second point is the same server, not started
    assert labels == ["algorithm=none ddtree.budget=16", "algorithm=ddtree ddtree.budget=16",
                      "algorithm=ddtree ddtree.budget=32"]
    assert ("skipping sweep point algorithm=none ddtree.budget=32: the same server as "
            "algorithm=none ddtree.budget=16 (algorithm none ignores ddtree.budget)") in r.stderr
    assert [c["config"]["ddtree"]["budget"] for c in doc["configs"]] == [16, 16, 32]
    assert all(c["error"] is None for c in doc["configs"])
    assert doc["baseline"] == labels[0]
    assert len(doc["records"]) == 3 * 2 * 3
    acc = {(s["config"], s["concurrency"]): s["accept_length"] for s in doc["summaries"]}
    # the override reached the server: only the speculative configurations report acceptance
    assert acc[(labels[0], 1)] is None and acc[(labels[1], 1)] == pytest.approx(3.0)
    cmp_ = {(c["config"], c["concurrency"]): c for c in doc["comparison"]}
    assert cmp_[(labels[0], 2)]["throughput_ratio"] == pytest.approx(1.0)
    assert "against the baseline algorithm=none ddtree.budget=16" in r.stdout
    # the fastest configuration per level, from the same summaries, printed and in --json
    fastest = {}
    for s_ in doc["summaries"]:
        c = s_["concurrency"]
        if c not in fastest or s_["output_tokens_per_s"] > fastest[c]["output_tokens_per_s"]:
            fastest[c] = s_
    assert [(b["concurrency"], b["config"], b["candidates"]) for b in doc["best"]] == [
        (c, fastest[c]["config"], 3) for c in (1, 2)]
    assert "fastest per concurrency" in r.stdout
    assert not has_mpl or png.read_bytes()[:4] == b"\x89PNG"
    assert not listening(port)  # every server was stopped


def test_a_config_whose_server_dies_fails_alone(tmp_path):
    needs_serve()
    cfg = write_config(tmp_path / "cfg.json")
    out = tmp_path / "out.json"
    r = bench("--config", str(cfg),
              "--sweep", 'environment={"STANDIN_CRASH_BEFORE_READY":"7"},{}',
              "--num-prompts", "2", "--max-new-tokens", "4", "--json", str(out),
              "--log-dir", str(tmp_path / "logs"), timeout=120)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    first, second = json.loads(out.read_text())["configs"]
    assert "serve exited with code 7 before /health answered 200" in first["error"]
    assert any("simulated failure while loading weights" in ln for ln in first["log_tail"])
    assert "  | " in r.stderr and "simulated failure" in r.stderr
    assert second["error"] is None
    assert "2/2" in r.stdout
    assert "no comparison: the baseline" in r.stdout  # the baseline was the failed one
    kept = json.loads((tmp_path / "logs" / "config-1.json").read_text())
    assert kept["environment"] == {"STANDIN_CRASH_BEFORE_READY": "7"}
    assert "simulated failure" in (tmp_path / "logs" / "config-1.stderr.log").read_text()


def test_a_started_server_dying_mid_run_fails_with_its_stderr(tmp_path):
    needs_serve()
    cfg = write_config(tmp_path / "cfg.json", environment={"STANDIN_DIE_AFTER_REQUESTS": "3"})
    out = tmp_path / "out.json"
    r = bench("--config", str(cfg), "--num-prompts", "10", "--max-new-tokens", "4",
              "--json", str(out), "--quiet", timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    (c,) = json.loads(out.read_text())["configs"]
    assert "after 2 completed requests" in c["error"]  # 1 warm-up + 2 measured
    assert any("[stand-in sglang]" in ln for ln in c["log_tail"])


def test_server_that_never_gets_ready_times_out(tmp_path):
    needs_serve()
    cfg = write_config(tmp_path / "cfg.json", environment={"STANDIN_NEVER_READY": "1"})
    port = json.loads(cfg.read_text())["port"]
    t0 = time.monotonic()
    r = bench("--config", str(cfg), "--start-timeout", "2", "--quiet", timeout=60)
    assert r.returncode == 1
    assert "did not answer 200 within 2 s" in r.stderr
    assert time.monotonic() - t0 < 40
    assert not listening(port)


def test_ctrl_c_stops_the_server_it_started(tmp_path):
    needs_serve()
    cfg = write_config(tmp_path / "cfg.json", environment={"STANDIN_TOKEN_DELAY": "0.02"})
    port = json.loads(cfg.read_text())["port"]
    out = tmp_path / "out.json"
    p = popen_bench("--config", str(cfg), "--num-prompts", "50", "--max-new-tokens", "20",
                    "--json", str(out), stderr=subprocess.PIPE, stdout=subprocess.PIPE)
    wait_for_port(port, timeout=30)
    time.sleep(1.5)
    p.send_signal(signal.SIGINT)
    _, stderr = p.communicate(timeout=45)
    assert p.returncode == 130, stderr
    assert json.loads(out.read_text())["interrupted"] is True
    assert not listening(port)


def _standin_counter(url: str, name: str) -> int:
    """A counter of the stand-in's /metrics (``--enable-metrics``), by its name."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return int(float(next(ln.split()[-1] for ln in text.splitlines() if ln.startswith(name))))


def _requests_served(url: str) -> int:
    """The stand-in's sglang:num_requests_total (every /generate it answered)."""
    return _standin_counter(url, "sglang:num_requests_total")


def test_warmup_wave_sends_one_unrecorded_wave_per_level(standin_server, tmp_path):
    url = standin_server("--enable-metrics")
    before = _requests_served(url)
    out = tmp_path / "out.json"
    r = bench("--url", url, "--num-prompts", "2", "--max-new-tokens", "8", "--warmup", "0",
              "--warmup-wave", "--concurrency", "1,3", "--json", str(out), "--quiet")
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert [s["requests"] for s in doc["summaries"]] == [2, 2]  # the waves are not recorded
    assert _requests_served(url) - before == 2 + 2 + 1 + 3  # but were sent: 1, then 3


def test_warmup_waves_send_k_waves_in_one_closed_loop_and_report_them(standin_server,
                                                                         tmp_path):
    url = standin_server("--enable-metrics")
    before = _requests_served(url)
    out = tmp_path / "out.json"
    r = bench("--url", url, "--num-prompts", "2", "--max-new-tokens", "8", "--warmup", "0",
              "--warmup-waves", "2", "--concurrency", "1,3", "--json", str(out), "--quiet")
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert [s["requests"] for s in doc["summaries"]] == [2, 2]  # the waves are not recorded
    assert _requests_served(url) - before == 2 + 2 + 2 * 1 + 2 * 3  # but were sent: 2x1, 2x3
    # ...and reported apart, per level: a first-use pause stays visible
    assert [(w["concurrency"], w["requests"], w["ok"]) for w in doc["warmups"]] == [
        (1, 2, 2), (3, 6, 6)]
    assert all(w["ttft_p50"] is not None for w in doc["warmups"])


def _gc_freezes(url: str) -> int:
    """The stand-in's standin:gc_freezes_total (every /freeze_gc it answered)."""
    return _standin_counter(url, "standin:gc_freezes_total")


def test_freeze_gc_posts_once_per_level_after_its_warmup(standin_server, tmp_path):
    url = standin_server("--enable-metrics")
    out = tmp_path / "out.json"
    r = bench("--url", url, "--num-prompts", "2", "--max-new-tokens", "8", "--warmup", "1",
              "--warmup-waves", "1", "--freeze-gc", "--concurrency", "1,2", "--json", str(out),
              "--quiet")
    assert r.returncode == 0, r.stderr
    assert _gc_freezes(url) == 2  # one before each level
    doc = json.loads(out.read_text())
    assert [s["requests"] for s in doc["summaries"]] == [2, 2]
    assert "--freeze-gc" in doc["argv"]


def test_no_freeze_gc_unless_asked(standin_server, tmp_path):
    url = standin_server("--enable-metrics")
    r = bench("--url", url, "--num-prompts", "1", "--max-new-tokens", "4", "--quiet")
    assert r.returncode == 0, r.stderr
    assert _gc_freezes(url) == 0


def test_freeze_gc_refused_is_one_line_and_nothing_measured(standin_server, tmp_path):
    url = standin_server(STANDIN_NO_FREEZE_GC="1")
    out = tmp_path / "out.json"
    r = bench("--url", url, "--num-prompts", "2", "--max-new-tokens", "8", "--freeze-gc",
              "--json", str(out), "--quiet")
    assert r.returncode == 1
    assert "/freeze_gc answered 404, not 200" in one_line_error(r.stderr)
    assert json.loads(out.read_text())["summaries"] == []


def test_warmup_waves_negative_is_one_line(tmp_path):
    r = bench("--url", "http://127.0.0.1:9", "--warmup-waves", "-1", "--quiet")
    assert r.returncode == 2
    assert "--warmup-waves -1: must not be negative" in one_line_error(r.stderr)


def test_warmup_wave_failure_is_one_line(standin_server, tmp_path):
    url = standin_server(STANDIN_DIE_AFTER_REQUESTS="1")
    r = bench("--url", url, "--num-prompts", "2", "--max-new-tokens", "8", "--warmup", "0",
              "--warmup-wave", "--concurrency", "2", "--quiet")
    assert r.returncode == 1
    assert "warm-up wave at concurrency 2 failed" in one_line_error(r.stderr)


def test_the_first_warmup_wave_admits_half_beside_running_requests(standin_server):
    """A server's first prefill admitted beside running requests paused it ~0.4 s once
    (§28/§29); a closed loop of equal requests need not cause one before the measured level.
    The warm-up's first wave now starts half its requests 0.25 s after the others."""
    from sglang_dflash.bench.client import parse_url
    from sglang_dflash.bench.runner import (
        SPLIT_ADMISSION_DELAY_S,
        Sampling,
        run_level,
        split_admission_delays,
    )
    from sglang_dflash.bench.workload import Prompt

    assert split_admission_delays(1) == [0.0]
    assert split_admission_delays(4) == [0.0, 0.0, SPLIT_ADMISSION_DELAY_S,
                                         SPLIT_ADMISSION_DELAY_S]
    assert split_admission_delays(3) == [0.0, SPLIT_ADMISSION_DELAY_S, SPLIT_ADMISSION_DELAY_S]
    url = standin_server(STANDIN_TOKEN_DELAY="0.05")  # a request lasts ~0.4 s, as on a GPU
    prompts = [Prompt(text=f"p{i}") for i in range(4)]
    level = run_level(parse_url(url), "x", prompts, 4, Sampling(8, 0.0), 30.0,
                      start_delays=split_admission_delays(4))
    starts = sorted(r.start for r in level.records)
    assert all(r.ok for r in level.records) and len(starts) == 4
    assert starts[1] < 0.2 <= SPLIT_ADMISSION_DELAY_S - 0.05 <= starts[2]
