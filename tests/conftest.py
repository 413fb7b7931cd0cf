"""Shared test fixtures: paths into the repository and the stand-in SGLang server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests" / "standin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def standin_env(**extra: str) -> dict[str, str]:
    """Environment in which `python -m sglang.launch_server` starts the stand-in."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(STANDIN), str(REPO / "src")])
    env.update(extra)
    return env


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def standin_server() -> Iterator[callable]:
    """Start stand-in SGLang servers: `url = standin_server(*argv, **env)`; stopped at teardown."""
    procs: list[subprocess.Popen] = []

    def start(*argv: str, **env: str) -> str:
        port = free_port()
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", "standin-model",
               "--port", str(port), *argv]
        proc = subprocess.Popen(cmd, env=standin_env(**env), stderr=subprocess.DEVNULL)
        procs.append(proc)
        wait_for_port(port)
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def triton_interpret(monkeypatch):
    """Triton kernel tests without CUDA: the interpreter reads TRITON_INTERPRET while a kernel
    runs too (tests/ddtree/triton_env.py imports the kernel modules in that mode). Used as
    ``pytestmark = pytest.mark.usefixtures("triton_interpret")``."""
    from tests.ddtree.triton_env import interpret_on_cpu

    interpret_on_cpu(monkeypatch)
