"""`sglang-dflash serve` against a real child process (tests/standin), as systemd runs it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest


class Lines:
    """Collect a stream's lines with arrival times (a thread, so nothing blocks)."""

    def __init__(self, stream) -> None:
        self.items: list[tuple[float, str]] = []
        self._t = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._t.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.items.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, text: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in self.items:
                if text in line:
                    return t
            time.sleep(0.02)
        raise AssertionError(f"{text!r} not seen in {timeout}s; got: {self.text()}")

    def text(self) -> str:
        self._t.join(0.5)
        return "\n".join(line for _, line in self.items)


class NotifySocket:
    """A real sd_notify receiver: a unix datagram socket, by path or abstract name."""

    def __init__(self, tmp_path, abstract: bool) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = f"sglang-dflash-test-{uuid.uuid4().hex}"
            self.sock.bind(b"\0" + name.encode())
            self.env = "@" + name
        else:
            path = str(tmp_path / "notify.sock")
            self.sock.bind(path)
            self.env = path
        self.sock.settimeout(0.2)
        self.messages: list[str] = []

    def wait_for(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.messages:
                if text in m:
                    return m
            with contextlib.suppress(TimeoutError):
                self.messages.append(self.sock.recv(4096).decode())
        raise AssertionError(f"{text!r} not notified; got {self.messages}")


def child_pids(pid: int) -> list[int]:
    """The direct children of pid, read from /proc (serve has exactly one: SGLang)."""
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # the command name may hold spaces; fields after its closing ')' do not
            if int(stat_file.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat_file.parent.name))
    return found


def health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return r.status
    except OSError:
        return None


@pytest.mark.parametrize("abstract", [False, True], ids=["path-socket", "abstract-socket"])
def test_ready_notify_only_after_health_then_sigterm(
    tmp_path, make_config, start_serve, abstract
):
    """Slow start: READY=1 comes after /health says 200; SIGTERM is forwarded, child's code."""
    path, raw = make_config()
    notify = NotifySocket(tmp_path, abstract)
    argv_file = tmp_path / "argv.json"
    started = time.monotonic()
    p = start_serve(path, {"NOTIFY_SOCKET": notify.env, "STANDIN_BIND_DELAY": "0.5",
                           "STANDIN_READY_DELAY": "1.0", "STANDIN_EXIT_CODE_ON_TERM": "0",
                           "STANDIN_ARGV_FILE": str(argv_file)})
    err = Lines(p.stderr)
    notify.wait_for("STATUS=starting", 10)
    ready = notify.wait_for("READY=1", 15)
    assert time.monotonic() - started >= 1.5  # not before the stand-in's delays
    assert "STATUS=serving standin-model (ddtree)" in ready
    assert health(raw["port"]) == 200
    argv = json.loads(argv_file.read_text())
    assert argv[argv.index("--speculative-algorithm") + 1] == "DFLASH"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 0
    notify.wait_for("STOPPING=1", 2)
    assert health(raw["port"]) is None, "the child outlived serve"
    assert "ready after" in err.text()


@pytest.mark.parametrize(("signum", "expected"), [(signal.SIGTERM, 7), (signal.SIGINT, 130)])
def test_forwarded_signal_exit_code_is_the_childs(make_config, start_serve, signum, expected):
    """TERM: the stand-in exits 7 (STANDIN_EXIT_CODE_ON_TERM); INT kills it by signal: 128+2."""
    path, raw = make_config()
    p = start_serve(path, {"STANDIN_EXIT_CODE_ON_TERM": "7"})
    err = Lines(p.stderr)
    err.wait_for("ready after", 15)
    p.send_signal(signum)
    assert p.wait(timeout=10) == expected
    assert health(raw["port"]) is None


@pytest.mark.parametrize("ready", [False, True], ids=["while-starting", "after-ready"])
def test_sglang_self_kill_after_forwarded_term_is_a_clean_stop(make_config, start_serve, ready):
    """SGLang 0.5.17 ends a graceful SIGTERM shutdown by SIGKILLing itself: exit 0, one note."""
    path, raw = make_config()
    env = {"STANDIN_SELFKILL_ON_TERM": "1"}
    if not ready:
        env["STANDIN_NEVER_READY"] = "1"
    p = start_serve(path, env)
    err = Lines(p.stderr)
    err.wait_for("ready after" if ready else "listening on", 15)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 0
    text = err.text()
    assert "Gracefully exiting" in text  # the stand-in really took the SIGKILL path
    notes = [line for line in text.splitlines() if "treating the stop as clean" in line]
    assert len(notes) == 1 and "SIGKILL" in notes[0] and "SIGTERM" in notes[0], text
    assert health(raw["port"]) is None


def test_sigkill_without_a_forwarded_signal_stays_a_failure(make_config, start_serve):
    """An OOM-style SIGKILL nobody asked for is a crash: 137, the stderr tail, no 'clean'."""
    path, raw = make_config()
    p = start_serve(path)
    err = Lines(p.stderr)
    err.wait_for("ready after", 15)
    (child,) = child_pids(p.pid)
    os.kill(child, signal.SIGKILL)
    assert p.wait(timeout=10) == 128 + signal.SIGKILL
    text = err.text()
    assert "SGLang exited with code 137 after it was ready" in text
    assert "treating the stop as clean" not in text
    assert health(raw["port"]) is None


@pytest.mark.parametrize("interval", [0.1, 5.0])
def test_crash_before_ready_fails_fast_with_stderr_tail(make_config, start_serve, interval):
    """The child dies while loading: serve exits non-zero within 2 s, whatever the poll interval."""
    path, _ = make_config()
    p = start_serve(path, {"STANDIN_READY_DELAY": "0.5", "STANDIN_CRASH_BEFORE_READY": "9"},
                    interval=interval)
    err = Lines(p.stderr)
    died = err.wait_for("simulated failure while loading weights", 15)
    code = p.wait(timeout=5)
    latency = time.monotonic() - died
    assert code == 9
    assert latency < 2.0, f"serve took {latency:.2f}s after the child died"
    text = err.text()
    assert "exited with code 9 before it was ready" in text
    assert "  | [stand-in sglang] RuntimeError: simulated failure" in text
    print(f"fast-fail latency {latency:.3f}s at poll interval {interval}s")


def test_crash_after_ready_exits_nonzero_with_tail(tmp_path, make_config, start_serve):
    path, _ = make_config()
    notify = NotifySocket(tmp_path, abstract=False)
    # the crash comes after SGLang's 1 s /health has answered (serve saw it ready)
    p = start_serve(path, {"NOTIFY_SOCKET": notify.env, "STANDIN_CRASH_AFTER_READY": "2.5"})
    notify.wait_for("READY=1", 15)
    assert p.wait(timeout=10) == 3
    text = Lines(p.stderr).text()
    assert "exited with code 3 after it was ready" in text
    assert "simulated crash after ready" in text


def test_never_ready_fails_at_start_timeout(make_config, start_serve):
    path, raw = make_config(startTimeout=2)
    started = time.monotonic()
    p = start_serve(path, {"STANDIN_NEVER_READY": "1"})
    code = p.wait(timeout=20)
    took = time.monotonic() - started
    assert code == 1
    assert 2.0 <= took < 6.0
    text = Lines(p.stderr).text()
    assert "within startTimeout=2s" in text
    assert health(raw["port"]) is None, "the never-ready child was left running"


def test_sigterm_while_starting_is_forwarded(make_config, start_serve):
    path, _ = make_config()
    p = start_serve(path, {"STANDIN_NEVER_READY": "1", "STANDIN_EXIT_CODE_ON_TERM": "5"})
    err = Lines(p.stderr)
    err.wait_for("listening on", 15)
    p.send_signal(signal.SIGTERM)
    # the child's own exit code comes back; 15 s, not 5: on CI's 2 cores under a parallel pip
    # install the stand-in's SIGTERM handler once took longer than 5 s to run (2026-12-07)
    assert p.wait(timeout=15) == 5


def test_api_key_goes_through_private_file_not_argv(tmp_path, make_config, start_serve):
    key = "sk-" + uuid.uuid4().hex
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    path, _ = make_config(apiKeyFile=str(key_file))
    argv_file = tmp_path / "argv.json"
    p = start_serve(path, {"STANDIN_BIND_DELAY": "1.5", "RUNTIME_DIRECTORY": str(runtime),
                           "STANDIN_ARGV_FILE": str(argv_file)})
    err = Lines(p.stderr)
    err.wait_for("starting model=", 15)
    argv = json.loads(argv_file.read_text())
    key_yaml = runtime / "sglang-api-key.yaml"
    assert argv[argv.index("--config") + 1] == str(key_yaml)
    assert key not in " ".join(argv)
    assert stat.S_IMODE(key_yaml.stat().st_mode) == 0o600
    assert json.loads(key_yaml.read_text()) == {"api-key": key}
    err.wait_for("ready after", 15)
    assert not key_yaml.exists(), "the key file must be removed once SGLang is up"
    # the stand-in answers POST /freeze_gc only with the key (401 otherwise): serve sent it
    assert "froze SGLang's garbage collectors" in err.text(), err.text()
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=10)


def test_collectors_are_frozen_once_ready_and_before_ready_is_notified(tmp_path, make_config,
                                                                      start_serve):
    """freezeGc (on by default): once /health answers, serve POSTs /freeze_gc (the stand-in runs
    a real gc.freeze() and logs it), says so in one line, and only then notifies READY=1."""
    path, _ = make_config()
    notify = NotifySocket(tmp_path, abstract=False)
    p = start_serve(path, {"NOTIFY_SOCKET": notify.env, "STANDIN_READY_DELAY": "0.5"})
    err = Lines(p.stderr)
    notify.wait_for("READY=1", 15)
    ready_at = err.wait_for("ready after", 5)
    frozen_at = err.wait_for("froze SGLang's garbage collectors after its warm-up", 1)
    assert frozen_at <= ready_at
    err.wait_for("Freezing GC in Scheduler process", 1)  # the child's own line, relayed
    assert err.text().count("Freezing GC in Scheduler process") == 1
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=10)


def test_freeze_gc_off_sends_nothing(make_config, start_serve):
    path, _ = make_config(freezeGc=False)
    p = start_serve(path)
    err = Lines(p.stderr)
    err.wait_for("ready after", 15)
    time.sleep(0.3)
    assert "Freezing GC" not in err.text() and "froze" not in err.text()
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=10)


def test_a_server_that_refuses_the_freeze_is_still_served(make_config, start_serve):
    """An SGLang without /freeze_gc (404): one line saying so, and the server is served."""
    path, raw = make_config()
    p = start_serve(path, {"STANDIN_NO_FREEZE_GC": "1"})
    err = Lines(p.stderr)
    err.wait_for("ready after", 15)
    line = next(ln for ln in err.text().splitlines() if "could not freeze" in ln)
    assert "answered 404" in line and line.endswith("serving without it"), line
    assert health(raw["port"]) == 200 and p.poll() is None
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=10)


def test_api_key_prefers_systemd_credential(tmp_path, make_config, start_serve):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "api-key").write_text("from-credential\n")
    runtime = tmp_path / "run"
    runtime.mkdir()
    # apiKeyFile is unreadable for the service user under systemd; the credential is used
    path, _ = make_config(apiKeyFile=str(tmp_path / "root-only-key"))
    p = start_serve(path, {"STANDIN_BIND_DELAY": "1.0", "RUNTIME_DIRECTORY": str(runtime),
                           "CREDENTIALS_DIRECTORY": str(creds)})
    err = Lines(p.stderr)
    err.wait_for("starting model=", 15)
    assert json.loads((runtime / "sglang-api-key.yaml").read_text()) == {
        "api-key": "from-credential"}
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=10)


def test_missing_api_key_file_is_input_error(tmp_path, make_config, start_serve):
    path, _ = make_config(apiKeyFile=str(tmp_path / "nope"))
    p = start_serve(path)
    assert p.wait(timeout=15) == 2
    lines = Lines(p.stderr).text().strip().splitlines()
    assert len(lines) == 1 and "apiKeyFile: cannot read" in lines[0]


def test_print_argv_renders_env_and_command(make_config, start_serve):
    path, raw = make_config(gpus=[1], tensorParallelSize=1)
    r = subprocess.run([sys.executable, "-m", "sglang_dflash", "serve", "--config", str(path),
                        "--print-argv"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    out = r.stdout.strip()
    # a fixed-budget DDTree server must not inherit an adaptive policy from the caller
    assert out.startswith("env -u SGLANG_DFLASH_DDTREE_POLICY CUDA_VISIBLE_DEVICES=1 "
                          "SGLANG_DFLASH_DDTREE_BUDGET=8 ")
    tail = "-m sglang.launch_server --model-path standin-model --host 127.0.0.1 --port "
    tail += str(raw["port"])
    assert tail in out


def test_cache_directory_and_env_reach_the_child(tmp_path, make_config, start_serve):
    """The non-NixOS unit leaves cacheDir unset; serve uses systemd's $CACHE_DIRECTORY."""
    path, _ = make_config(environment={"NCCL_DEBUG": "WARN"})
    env_dump = tmp_path / "child-env.json"
    site = tmp_path / "site"
    site.mkdir()
    # imported by every interpreter on PYTHONPATH; only the child has the DDTree switch
    (site / "sitecustomize.py").write_text(
        "import json, os\n"
        "if 'SGLANG_DFLASH_DDTREE_BUDGET' in os.environ:\n"
        f"    json.dump(dict(os.environ), open({str(env_dump)!r}, 'w'))\n"
    )
    standin = Path(__file__).parents[1] / "standin"
    p = start_serve(path, {"PYTHONPATH": os.pathsep.join([str(standin), str(site)]),
                           "CACHE_DIRECTORY": str(tmp_path / "cache"),
                           "SGLANG_DFLASH_DDTREE_BUDGET": "999"})
    Lines(p.stderr).wait_for("ready after", 15)
    env = json.loads(env_dump.read_text())
    assert env["SGLANG_DFLASH_DDTREE_BUDGET"] == "8"  # the config wins over a stale value
    assert env["HF_HOME"] == str(tmp_path / "cache" / "huggingface")
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "cache" / "triton")
    assert env["NCCL_DEBUG"] == "WARN"
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=10)


def test_stale_ddtree_switch_is_removed_for_dflash(tmp_path, make_config, start_serve):
    path, _ = make_config(algorithm="dflash")
    env_dump = tmp_path / "child-env.json"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import json, os, sys\n"
        "if 'launch_server' in ' '.join(getattr(sys, 'orig_argv', [])):\n"
        f"    json.dump(dict(os.environ), open({str(env_dump)!r}, 'w'))\n"
    )
    standin = Path(__file__).parents[1] / "standin"
    p = start_serve(path, {"PYTHONPATH": os.pathsep.join([str(standin), str(site)]),
                           "SGLANG_DFLASH_DDTREE_BUDGET": "999"})
    Lines(p.stderr).wait_for("ready after", 15)
    env = json.loads(env_dump.read_text())
    assert "SGLANG_DFLASH_DDTREE_BUDGET" not in env
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=10)


def test_refuses_a_port_something_else_answers_on(make_config, start_serve):
    """Another server's /health must not make serve report READY for a dead SGLang."""
    import http.server

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    squatter = http.server.HTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    try:
        path, _ = make_config(port=squatter.server_address[1])
        p = start_serve(path)
        assert p.wait(timeout=15) == 1
        assert "already listens on" in Lines(p.stderr).text()
    finally:
        squatter.shutdown()


STUBBORN = """
import http.server, os, signal, sys, threading, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("stubborn: ignoring SIGTERM", file=sys.stderr, flush=True)
if os.environ.get("STUBBORN_READY") == "1":
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
        def log_message(self, *a):
            pass
    srv = http.server.HTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
while True:
    time.sleep(1)
"""


def stubborn_sglang(tmp_path) -> str:
    """A child that ignores SIGTERM: a real process (the stand-in always obeys TERM)."""
    pkg = tmp_path / "stubborn" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(STUBBORN)
    return str(pkg.parent)


@pytest.mark.parametrize("ready", [False, True], ids=["while-starting", "after-ready"])
def test_child_ignoring_sigterm_is_killed_after_grace(tmp_path, make_config, ready):
    path, _ = make_config()
    env = dict(os.environ, PYTHONPATH=stubborn_sglang(tmp_path),
               STUBBORN_READY="1" if ready else "0")
    env.pop("NOTIFY_SOCKET", None)
    p = subprocess.Popen([sys.executable, "-m", "sglang_dflash", "serve", "--config", str(path),
                          "--poll-interval", "0.1", "--stop-grace", "1"],
                         env=env, stderr=subprocess.PIPE, text=True)
    err = Lines(p.stderr)
    try:
        err.wait_for("ready after" if ready else "ignoring SIGTERM", 15)
        sent = time.monotonic()
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 128 + signal.SIGKILL
        assert 1.0 <= time.monotonic() - sent < 4.0
    finally:
        if p.poll() is None:
            p.kill()


def test_child_dies_with_a_killed_serve(make_config, start_serve):
    """serve SIGKILLed (no chance to forward): PR_SET_PDEATHSIG still stops SGLang."""
    path, raw = make_config()
    p = start_serve(path)
    Lines(p.stderr).wait_for("ready after", 15)
    assert health(raw["port"]) == 200
    p.kill()
    p.wait(timeout=5)
    deadline = time.monotonic() + 5
    while health(raw["port"]) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert health(raw["port"]) is None, "SGLang outlived a SIGKILLed serve"


@pytest.mark.parametrize(
    ("returncode", "forwarded", "killed_by_us", "code", "clean"),
    [
        (-signal.SIGKILL, signal.SIGTERM, False, 0, True),  # SGLang's own kill_process_tree
        (-signal.SIGQUIT, signal.SIGINT, False, 0, True),
        (-signal.SIGKILL, None, False, 137, False),  # OOM killer: a crash
        (-signal.SIGKILL, signal.SIGTERM, True, 137, False),  # serve gave up after the grace
        (-signal.SIGINT, signal.SIGINT, False, 130, False),
        (7, signal.SIGTERM, False, 7, False),
    ],
)
def test_stop_outcome(returncode, forwarded, killed_by_us, code, clean):
    from sglang_dflash.serve import stop_outcome

    out = stop_outcome(returncode, forwarded, killed_by_us)
    assert out.code == code
    assert (out.note is not None) == clean
