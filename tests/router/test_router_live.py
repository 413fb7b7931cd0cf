"""The real router (smg 1.13.0's binary, from its wheel) started by `sglang-dflash router`
against three stand-in SGLang servers started by `sglang-dflash serve`, on loopback.

Requests spread over all three; one stand-in is killed under load: every request is counted
(a 200 with the exact greedy tokens, or an error with its status and message; none lost
silently), the router stops sending to the dead one, and sends to it again once it is
restarted. `check --url` and `bench --url` run through the router.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO, STANDIN, free_port

pytest.importorskip("smg", reason="the router's wheel (pip install -e '.[router]') is missing")

PROMPT = [11, 12, 13, 14]
NEW = 8
DFLASH = {"draftModel": "standin-draft", "algorithm": "dflash"}


def expected_tokens(ids: list[int], n: int, vocab: int = 151936) -> list[int]:
    """The stand-in's deterministic greedy model (tests/standin/sglang/launch_server.py)."""
    ctx, out = list(ids), []
    for _ in range(n):
        a, b = ctx[-1], ctx[-2] if len(ctx) > 1 else 0
        tok = (a * 31 + b * 17 + 7) % vocab
        ctx.append(tok)
        out.append(tok)
    return out


EXPECTED = expected_tokens(PROMPT, NEW)


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e.pop("NOTIFY_SOCKET", None)
    e["PYTHONPATH"] = os.pathsep.join([str(STANDIN), str(REPO / "src")])
    e["STANDIN_TOKEN_DELAY"] = "0.005"
    e.update(extra)
    return e


class Fleet:
    """Stand-ins under `serve` plus the router under `sglang-dflash router`."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}

    def instance(self, name: str, **changes) -> Path:
        raw = {"name": name, "model": "standin-model", "gpus": [], "host": "127.0.0.1",
               "port": free_port(), "startTimeout": 30, **DFLASH, **changes}
        path = self.tmp / f"{name}.json"
        path.write_text(json.dumps(raw))
        return path

    def start(self, key: str, argv: list[str], extra_env: dict[str, str] | None = None):
        log = self.tmp / f"{key}.log"
        self.logs[key] = log
        p = subprocess.Popen([sys.executable, "-m", "sglang_dflash", *argv],
                             env=env(**(extra_env or {})), stdout=subprocess.DEVNULL,
                             stderr=log.open("w"))
        self.procs[key] = p
        return p

    def serve(self, name: str, config: Path):
        return self.start(name, ["serve", "--config", str(config), "--poll-interval", "0.05"])

    def wait_ready(self, key: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.logs[key].read_text()
            if "ready after" in text:
                return
            if self.procs[key].poll() is not None:
                raise AssertionError(f"{key} exited {self.procs[key].returncode}:\n{text}")
            time.sleep(0.05)
        raise AssertionError(f"{key} not ready in {timeout}s:\n{self.logs[key].read_text()}")

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=40)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def child_pid(pid: int) -> int:
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(kids) == 1, kids
    return int(kids[0])


def generate(base: str, key: str | None = None, timeout: float = 20) -> tuple[str, object]:
    """One /generate: ('ok', port) for the exact greedy tokens, else ('error', why)."""
    body = json.dumps({"input_ids": PROMPT, "sampling_params": {
        "temperature": 0, "max_new_tokens": NEW, "ignore_eos": True}}).encode()
    req = urllib.request.Request(base + "/generate", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            out = json.loads(r.read())
    except urllib.error.HTTPError as e:
        return "error", f"HTTP {e.code}: {e.read()[:200]!r}"
    except OSError as e:  # a reset or refused connection: visible to the client, not silent
        return "error", f"transport: {e}"
    if out.get("output_ids") != EXPECTED:  # a 200 with wrong or partial output = silent loss
        return "wrong", out
    return "ok", out["meta_info"]["standin_port"]


def get_json(url: str, timeout: float = 5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def wait_healthy_workers(base: str, n: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = get_json(base + "/readiness")
            if last.get("healthy_workers") == n:
                return
        except (OSError, ValueError) as e:
            last = e
        time.sleep(0.2)
    raise AssertionError(f"router never had {n} healthy workers: {last}")


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path)
    yield f
    f.stop_all()


def router_config(fleet: Fleet, workers: list[str], **changes) -> tuple[Path, str]:
    port = free_port()
    raw = {"name": "front", "workers": workers, "policy": "round_robin", "port": port,
           "metrics": {"port": free_port()}, "logLevel": "warn",
           "healthCheck": {"intervalSecs": 1, "timeoutSecs": 3, "failureThreshold": 1,
                           "successThreshold": 1},
           "retry": {"maxRetries": 3, "initialBackoffMs": 50, "maxBackoffMs": 200},
           "shutdownGraceSecs": 1, **changes}
    path = fleet.tmp / "router.json"
    path.write_text(json.dumps(raw))
    return path, f"http://127.0.0.1:{port}"


def test_three_standins_spread_failover_and_recovery(fleet):
    configs = {n: fleet.instance(n) for n in ("a", "b", "c")}
    for n, c in configs.items():
        fleet.serve(n, c)
    for n in configs:
        fleet.wait_ready(n)
    ports = {n: json.loads(c.read_text())["port"] for n, c in configs.items()}
    # workers by instance config path (how the NixOS module passes local instances)
    rconf, base = router_config(fleet, [str(c) for c in configs.values()])
    fleet.start("router", ["router", "--config", str(rconf), "--poll-interval", "0.1"])
    fleet.wait_ready("router")
    wait_healthy_workers(base, 3)

    # 1. spread: round robin reaches all three
    first = collections.Counter(generate(base) for _ in range(30))
    assert sum(first.values()) == 30
    assert {k for k, _ in first} == {"ok"}, first
    assert {p for _, p in first} == set(ports.values()), first

    # 2. kill b (its stand-in, SIGKILL) under load from 4 clients; count every request
    outcomes: list[tuple[float, str, object]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def client():
        while not stop.is_set():
            kind, what = generate(base)
            with lock:
                outcomes.append((time.monotonic(), kind, what))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    killed_at = time.monotonic()
    os.kill(child_pid(fleet.procs["b"].pid), signal.SIGKILL)
    time.sleep(6)  # several health-check intervals
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    sent = len(outcomes)
    by_kind = collections.Counter(k for _, k, _ in outcomes)
    assert by_kind["wrong"] == 0, [o for o in outcomes if o[1] == "wrong"][:3]
    assert by_kind["ok"] + by_kind["error"] == sent  # every request accounted for
    assert all(isinstance(w, str) and w for _, k, w in outcomes if k == "error")
    before = [w for t, k, w in outcomes if k == "ok" and t < killed_at]
    assert ports["b"] in before, "b served nothing before it was killed"
    late = [(k, w) for t, k, w in outcomes if t > killed_at + 3]
    assert late, "no requests finished after the kill"
    assert all(k == "ok" and w != ports["b"] for k, w in late), late[:5]
    print(f"\nunder load: {sent} requests, {dict(by_kind)}; errors: "
          f"{[w for _, k, w in outcomes if k == 'error'][:3]}")
    assert fleet.procs["b"].wait(timeout=10) != 0  # serve saw its server die

    # 3. the router no longer sends to b
    after = collections.Counter(generate(base) for _ in range(20))
    assert {k for k, _ in after} == {"ok"}, after
    assert {p for _, p in after} == {ports["a"], ports["c"]}, after

    # 4. b restarts: the router sends to it again
    fleet.serve("b", configs["b"])
    fleet.wait_ready("b")
    deadline = time.monotonic() + 90
    seen_b = False
    while time.monotonic() < deadline and not seen_b:
        kind, port = generate(base)
        assert kind == "ok", port
        seen_b = port == ports["b"]
        time.sleep(0.1)
    assert seen_b, "the router never sent to the restarted stand-in"

    # 5. check --url and bench --url through the router
    r = subprocess.run([sys.executable, "-m", "sglang_dflash", "check", "--layer", "live",
                        "--url", base, "--expect-algorithm", "dflash",
                        "--expect-draft-model", "standin-draft", "--json"],
                       env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    res = {x["name"]: x for x in json.loads(r.stdout)["results"]}
    assert res["generate"]["status"] == "PASS" and res["speculation"]["status"] == "PASS"
    out = fleet.tmp / "bench.json"
    r = subprocess.run([sys.executable, "-m", "sglang_dflash", "bench", "--url", base,
                        "--num-prompts", "24", "--concurrency", "6", "--max-new-tokens", "16",
                        "--synthetic-input-len", "16", "--json", str(out), "--quiet"],
                       env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    (summary,) = json.loads(out.read_text())["summaries"]
    assert (summary["requests"], summary["ok"], summary["errors"]) == (24, 24, 0), summary
    assert summary["output_tokens"] == 24 * 16 and summary["accept_length"], summary

def test_router_with_api_key_file_keeps_the_key_off_argv(fleet, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("sk-router-test\n")
    inst = fleet.instance("k", apiKeyFile=str(key_file))
    fleet.serve("k", inst)
    fleet.wait_ready("k")
    rconf, base = router_config(fleet, [str(inst)], apiKeyFile=str(key_file))
    fleet.start("router", ["router", "--config", str(rconf), "--poll-interval", "0.1"])
    fleet.wait_ready("router")
    wait_healthy_workers_with_key(base, "sk-router-test")
    assert generate(base)[0] == "error" and "401" in generate(base)[1]
    assert generate(base, key="sk-router-test")[0] == "ok"
    child = child_pid(fleet.procs["router"].pid)
    for pid in (fleet.procs["router"].pid, child):
        assert b"sk-router-test" not in Path(f"/proc/{pid}/cmdline").read_bytes()


def wait_healthy_workers_with_key(base: str, key: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if generate(base, key=key)[0] == "ok":
            return
        time.sleep(0.3)
    raise AssertionError("the router never served with its key")
