"""Helpers for serve tests: a free port, a config file, and serve run as a real process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

STANDIN = Path(__file__).parents[1] / "standin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def make_config(tmp_path):
    def make(**changes) -> tuple[Path, dict]:
        raw = {
            "name": "t",
            "model": "standin-model",
            "draftModel": "standin-draft",
            "algorithm": "ddtree",
            "ddtree": {"budget": 8},
            "gpus": [],
            "tensorParallelSize": 1,
            "host": "127.0.0.1",
            "port": free_port(),
            "startTimeout": 30,
        }
        raw.update(changes)
        path = tmp_path / "instance.json"
        path.write_text(json.dumps(raw))
        return path, raw

    return make


@pytest.fixture
def start_serve(tmp_path):
    procs: list[subprocess.Popen] = []

    def start(config: Path, env: dict[str, str] | None = None, interval: float = 0.1):
        full = dict(os.environ)
        full.pop("NOTIFY_SOCKET", None)
        full["PYTHONPATH"] = os.pathsep.join(
            [str(STANDIN), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        full.update(env or {})
        p = subprocess.Popen(
            [sys.executable, "-m", "sglang_dflash", "serve", "--config", str(config),
             "--poll-interval", str(interval)],
            env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
