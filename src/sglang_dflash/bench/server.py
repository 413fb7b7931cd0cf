"""Start and stop one `sglang-dflash serve --config` per sweep point.

The server runs in its own session, so a Ctrl-C at the terminal reaches only the bench,
which then stops the server itself (SIGTERM to serve, which owns its SGLang child; the
process group is killed only if serve ignores SIGTERM past the grace period).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_dflash.bench.client import Endpoint, connect_host, health
from sglang_dflash.config import parse_config


class LaunchError(Exception):
    """A configuration that could not be served; str() is one line, `log_tail` the evidence."""

    def __init__(self, message: str, log_tail: list[str] | None = None) -> None:
        super().__init__(message)
        self.log_tail = log_tail or []


@dataclass(frozen=True)
class Instance:
    """What the bench needs from a validated config: where it listens, and its key file."""

    host: str
    port: int
    api_key_file: str | None
    start_timeout: float | None


def validate(raw: dict[str, Any]) -> Instance:
    """Validate with the config module, the one validator; ValueError (ConfigError) if bad."""
    cfg = parse_config(raw)
    return Instance(cfg.host, cfg.port, cfg.api_key_file, cfg.start_timeout)


def tail(path: Path, n: int = 8) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return [ln for ln in lines if ln.strip()][-n:]


@dataclass
class Launched:
    proc: subprocess.Popen
    endpoint: Endpoint
    stderr_path: Path

    def gone(self) -> str | None:
        """A one-line reason once the serve process has exited, else None."""
        rc = self.proc.poll()
        return None if rc is None else f"the server exited with code {rc} during the run"


def serve_argv(config_path: Path) -> list[str]:
    return [sys.executable, "-m", "sglang_dflash", "serve", "--config", str(config_path)]


def start(raw: dict[str, Any], inst: Instance, workdir: Path, tag: str, api_key: str | None,
          start_timeout: float, sleep: Callable[[float], None] = time.sleep) -> Launched:
    """Write the config, start serve, and wait for /health 200 (bounded).

    Raises LaunchError if serve exits first or the timeout passes; the server is stopped
    before raising. KeyboardInterrupt propagates with the server stopped as well.
    """
    config_path = workdir / f"{tag}.json"
    config_path.write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    stderr_path = workdir / f"{tag}.stderr.log"
    with open(workdir / f"{tag}.stdout.log", "wb") as out, open(stderr_path, "wb") as err:
        proc = subprocess.Popen(serve_argv(config_path), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err, start_new_session=True)
    ep = Endpoint("http", connect_host(inst.host), inst.port, "", api_key)
    launched = Launched(proc, ep, stderr_path)
    try:
        wait_ready(launched, start_timeout, sleep)
    except BaseException:
        stop(launched)
        raise
    return launched


def wait_ready(s: Launched, timeout: float, sleep: Callable[[float], None]) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while True:
        rc = s.proc.poll()
        if rc is not None:
            raise LaunchError(f"serve exited with code {rc} before /health answered 200",
                              tail(s.stderr_path))
        try:
            status = health(s.endpoint, timeout=min(5.0, max(0.5, deadline - time.monotonic())))
            if status == 200:
                return
            last = f"/health answered {status}"
        except OSError as e:
            last = f"{type(e).__name__}: {e}"
        if time.monotonic() >= deadline:
            raise LaunchError(f"{s.endpoint.url}/health did not answer 200 within {timeout:g} s "
                              f"(--start-timeout); last: {last}", tail(s.stderr_path))
        sleep(0.25)


def exited_within(s: Launched, seconds: float) -> bool:
    """Whether serve exits within `seconds` (it notices its child's death by polling)."""
    try:
        s.proc.wait(seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def stop(s: Launched, grace: float = 30.0) -> int | None:
    """SIGTERM serve and wait; SIGKILL its process group after `grace` seconds."""
    if s.proc.poll() is None:
        try:
            s.proc.send_signal(signal.SIGTERM)
            s.proc.wait(grace)
        except subprocess.TimeoutExpired:
            _kill_group(s.proc.pid)
            s.proc.wait(10)
        except KeyboardInterrupt:  # a second Ctrl-C: do not wait politely
            _kill_group(s.proc.pid)
            s.proc.wait(10)
            raise
    return s.proc.returncode
