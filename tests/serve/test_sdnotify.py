"""sd_notify over a real unix datagram socket (path and abstract), stdlib only."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid

from sglang_dflash.sdnotify import notify, socket_address


def test_socket_address_forms():
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("@abc") == b"\0abc"
    assert socket_address("") is None
    assert socket_address("relative/sock") is None
    assert socket_address("vsock:2:1234") is None


def test_notify_path_and_abstract(tmp_path):
    path_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path_sock.bind(str(tmp_path / "n.sock"))
    name = f"sd-test-{uuid.uuid4().hex}"
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    abstract.bind(b"\0" + name.encode())
    for sock, value in ((path_sock, str(tmp_path / "n.sock")), (abstract, "@" + name)):
        sock.settimeout(2)
        assert notify("READY=1\nSTATUS=ok", {"NOTIFY_SOCKET": value}) is True
        assert sock.recv(4096) == b"READY=1\nSTATUS=ok"
        sock.close()


def test_notify_without_or_with_a_dead_socket_is_false(tmp_path):
    assert notify("READY=1", {}) is False
    assert notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")}) is False


def test_poll_interval_out_of_range_is_usage_error(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"name": "x", "model": "m", "algorithm": "none"}')
    r = subprocess.run([sys.executable, "-m", "sglang_dflash", "serve", "--config", str(cfg),
                        "--poll-interval", "0"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--poll-interval" in r.stderr
