"""Who listens on a port, from the real /proc: serve's readiness counts only its own child's
socket (gpu-results.md §34: a stale server that bound the port after serve's start-up check
answered /health for a new instance whose SGLang could not bind)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang_dflash import portowner

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")

FOREIGN = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _listen() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


def test_own_socket_other_tree_and_nothing():
    s, port = _listen()
    other = subprocess.Popen(["sleep", "30"])
    try:
        assert portowner.listener(port, os.getpid()).ours is True
        verdict = portowner.listener(port, other.pid)  # the socket is ours, not sleep's
        assert verdict.ours is False and os.getpid() in verdict.others
    finally:
        other.kill()
        s.close()
    assert portowner.listener(port, os.getpid()) == portowner.Listener(ours=None)


def test_a_descendants_socket_counts_for_the_root():
    """serve's child may hand the socket to its own children: the whole tree counts."""
    s, port = _listen()
    s.close()  # a free port number
    shell = subprocess.Popen(["bash", "-c", f'{sys.executable} -c "$0" "$1"; true', FOREIGN,
                              str(port)], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not portowner.listening_inodes(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert portowner.listener(port, shell.pid).ours is True  # bash -> python
        assert portowner.listener(port, os.getpid()).ours is True  # and the test's tree
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()


def test_tcp6_and_states_parsed(tmp_path):
    net = tmp_path / "net"
    net.mkdir()
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt uid\n"
    tail = " 00000000:00000000 00:00000000 00000000 0 0 {} 1\n"
    zero6 = "0" * 32
    (net / "tcp").write_text(head
                             + "   0: 0100007F:7530 00000000:0000 0A" + tail.format(111)
                             + "   1: 0100007F:7530 0100007F:9C40 01" + tail.format(222))
    (net / "tcp6").write_text(head + f"   0: {zero6}:7530 {zero6}:0000 0A" + tail.format(333))
    assert portowner.listening_inodes(30000, tmp_path) == {111, 333}  # 222 is a connection
    assert portowner.listening_inodes(30001, tmp_path) == set()
    assert portowner.listening_inodes(30000, tmp_path / "none") is None


def test_serve_does_not_take_a_stale_servers_answer_for_its_own(make_config, start_serve,
                                                                tmp_path):
    """The §34 race: the port is free at serve's check, a stale server binds it while SGLang
    starts. serve says so once, never says ready, and fails when SGLang cannot bind."""
    path, raw = make_config()
    port = raw["port"]
    p = start_serve(path, {"STANDIN_BIND_DELAY": "4"})
    deadline = time.monotonic() + 20
    while len(portowner.process_tree(p.pid)) < 2:  # SGLang started: the port check is behind
        assert p.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    foreign = subprocess.Popen([sys.executable, "-c", FOREIGN, str(port)])
    try:
        _, err = p.communicate(timeout=60)
    finally:
        foreign.kill()
        foreign.wait()
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0
    assert f"answers /health from pid {foreign.pid}, not this instance's SGLang" in err, err
    assert err.count("not this instance's SGLang") == 1
    assert "ready after" not in err
