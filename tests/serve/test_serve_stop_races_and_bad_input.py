"""serve: a stop that races readiness, and argv/env that cannot be exec'd, fail in one line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from tests.serve.test_serve import Lines, NotifySocket

# A child whose /health makes serve receive SIGTERM while the probe is in flight, then
# answers 200 anyway; it stops 1 s after the forwarded TERM (as SGLang's drain does).
RACY = """
import http.server, os, signal, sys, threading, time
port = int(sys.argv[sys.argv.index("--port") + 1])
signal.signal(signal.SIGTERM, lambda *_: threading.Timer(1.0, os._exit, (0,)).start())
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        os.kill(os.getppid(), signal.SIGTERM)
        time.sleep(0.2)  # inside the probe timeout (--poll-interval 1)
        self.send_response(200)
        self.end_headers()
    def log_message(self, *a):
        pass
srv = http.server.HTTPServer(("127.0.0.1", port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
while True:
    time.sleep(1)
"""


def test_no_ready_after_a_stop_that_raced_the_last_probe(tmp_path, make_config):
    """systemd must never get READY=1 after STOPPING=1."""
    pkg = tmp_path / "racy" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(RACY)
    path, _ = make_config()
    notify = NotifySocket(tmp_path, abstract=False)
    env = dict(os.environ, PYTHONPATH=str(pkg.parent), NOTIFY_SOCKET=notify.env)
    p = subprocess.Popen([sys.executable, "-m", "sglang_dflash", "serve", "--config", str(path),
                          "--poll-interval", "1", "--stop-grace", "5"],
                         env=env, stderr=subprocess.PIPE, text=True)
    err = Lines(p.stderr)
    try:
        assert p.wait(timeout=15) == 0, err.text()
    finally:
        if p.poll() is None:
            p.kill()
    notify.wait_for("STOPPING=1", 2)
    assert not any("READY=1" in m for m in notify.messages), notify.messages
    assert "ready after" not in err.text()


def test_nul_in_config_is_a_one_line_input_error(tmp_path, make_config):
    """A NUL cannot be passed in argv or the environment: exit 2 naming the key, no traceback."""
    for changes, key in (({"model": "a\0b"}, "model:"),
                         ({"environment": {"A": "x\0"}}, "environment.A"),
                         ({"extraArgs": ["--x", "a\0"]}, "extraArgs")):
        path, _ = make_config(**changes)
        r = subprocess.run([sys.executable, "-m", "sglang_dflash", "serve", "--config",
                            str(path)], capture_output=True, text=True, timeout=30,
                           env={k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"})
        assert r.returncode == 2, r.stderr
        assert r.stderr.count("\n") == 1 and key in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


def _serve(config, env, **popen):
    return subprocess.Popen([sys.executable, "-m", "sglang_dflash", "serve", "--config",
                             str(config), "--poll-interval", "0.1"],
                            env=env, stderr=subprocess.PIPE, text=True, **popen)


def test_sigterm_before_sglang_starts_removes_the_key_file(tmp_path, make_config):
    """The window between writing the key file and spawning SGLang: TERM must not leak it.

    A listener whose accept queue is full makes serve's port probe hang for its 1 s timeout,
    which holds serve inside that window long enough to signal it there.
    """
    key = tmp_path / "key"
    key.write_text("sk-secret\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(8):  # fill the queue; later SYNs are dropped, so connect() hangs
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(listener.getsockname())
        fillers.append(c)
    time.sleep(0.2)
    path, _ = make_config(apiKeyFile=str(key), port=listener.getsockname()[1])
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "RUNTIME_DIRECTORY")}
    env["TMPDIR"] = str(tmp)
    p = _serve(path, env)
    try:
        deadline = time.monotonic() + 10
        while not list(tmp.glob("sglang-dflash-*/sglang-api-key.yaml")):
            assert time.monotonic() < deadline and p.poll() is None, "no key file appeared"
            time.sleep(0.01)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
        for c in fillers:
            c.close()
        listener.close()
    assert list(tmp.iterdir()) == [], "the API key file outlived serve"


def test_unwritable_runtime_directory_is_one_line(tmp_path, make_config):
    key = tmp_path / "key"
    key.write_text("sk-secret\n")
    path, _ = make_config(apiKeyFile=str(key))
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    env["RUNTIME_DIRECTORY"] = str(tmp_path / "missing")
    p = _serve(path, env)
    err = p.communicate(timeout=30)[1]
    assert p.returncode == 1 and err.count("\n") == 1 and "API key" in err, err
