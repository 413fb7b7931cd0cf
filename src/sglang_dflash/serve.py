"""Supervise one SGLang server as systemd expects (what `sglang-dflash serve` runs).

Starts `python -m sglang.launch_server` (this interpreter) as a child, polls /health, and
tells systemd READY=1 only when the server answers. A child that dies before it is ready
fails the start within about a second, with its last stderr lines in the journal; SIGTERM
and SIGINT are forwarded and serve exits with the child's code, except that SGLang 0.5.17
ends a graceful shutdown by SIGKILLing itself (kill_process_tree), which counts as a clean stop.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from sglang_dflash import portowner, sdnotify
from sglang_dflash.apikey import read_api_key
from sglang_dflash.bench.client import Endpoint, health
from sglang_dflash.bench.client import freeze_gc as post_freeze_gc
from sglang_dflash.config import InstanceConfig, render_argv, render_env
from sglang_dflash.config import unset_env as config_unset_env
from sglang_dflash.hosts import health_host

STDERR_TAIL = 20
TERM_GRACE_S = 30.0
FREEZE_GC_TIMEOUT_S = 30.0


def _err(msg: str) -> None:
    """A line for the journal (the child's fate, a clean-stop note): not a usage error."""
    print(f"sglang-dflash serve: {msg}", file=sys.stderr, flush=True)


# ---- pure helpers ---------------------------------------------------------------------------


def child_command(cfg: InstanceConfig, python: str = sys.executable) -> list[str]:
    return [python, "-m", "sglang.launch_server", *render_argv(cfg)]


def exit_code(returncode: int) -> int:
    """A child killed by signal N reports -N; shells and systemd say 128+N."""
    return 128 - returncode if returncode < 0 else returncode


# SGLang's kill_process_tree ends its own graceful shutdown with SIGKILL (then SIGQUIT).
SELF_KILL_SIGNALS = (signal.SIGKILL, signal.SIGQUIT)


@dataclasses.dataclass(frozen=True)
class StopOutcome:
    code: int
    note: str | None = None


def stop_outcome(returncode: int, forwarded: int | None, killed_by_us: bool) -> StopOutcome:
    """serve's exit code once the child is gone, and a one-line note when it is reinterpreted.

    After serve forwarded SIGTERM/SIGINT, a child that then dies by SIGKILL/SIGQUIT (SGLang's
    kill_process_tree aimed at itself) stopped cleanly (0); without a forwarded signal (an OOM
    kill, say), or when serve itself killed it after the grace period, that stays a failure.
    """
    signum = -returncode if returncode < 0 else None
    if forwarded is not None and not killed_by_us and signum in SELF_KILL_SIGNALS:
        name = signal.Signals(signum).name
        return StopOutcome(0, f"SGLang ended its shutdown with {name} (as 0.5.17 does after "
                              f"{signal.Signals(forwarded).name}); treating the stop as clean")
    return StopOutcome(exit_code(returncode))


def render_print(cfg: InstanceConfig, python: str = sys.executable) -> str:
    """The child's command as one shell line: `env [-u VAR] VAR=value ... python -m ...`."""
    words = ["env"]
    for k in config_unset_env(cfg):
        words += ["-u", k]
    words += [f"{k}={v}" for k, v in sorted(render_env(cfg).items())]
    return shlex.join(words + child_command(cfg, python))


# ---- API key --------------------------------------------------------------------------------


def write_key_config(key: str, environ: dict[str, str]) -> Path:
    """SGLang has no env var for its key; its --config YAML keeps it out of /proc/*/cmdline.

    The file goes to the unit's private RuntimeDirectory (or a fresh 0700 temp dir), is
    created 0600, and serve deletes it once the server is ready.
    """
    runtime = environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    base = Path(runtime) if runtime else Path(tempfile.mkdtemp(prefix="sglang-dflash-"))
    path = base / "sglang-api-key.yaml"
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps({"api-key": key}) + "\n")  # JSON is valid YAML
    return path


def remove_key_config(path: Path | None) -> None:
    if path is None:
        return
    with contextlib.suppress(OSError):
        path.unlink()
    if path.parent.name.startswith("sglang-dflash-") and path.parent.parent == Path(
        tempfile.gettempdir()
    ):
        with contextlib.suppress(OSError):
            path.parent.rmdir()


# ---- the child ------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child: SIGTERM when serve dies, so no server outlives a killed serve."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class StderrTail:
    """Copy the child's stderr through to ours (the journal) and keep the last lines."""

    def __init__(self, stream, keep: int = STDERR_TAIL) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._stream = stream
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        for raw in iter(self._stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append(line)
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(line + "\n")
                sys.stderr.flush()

    def finish(self, timeout: float = 0.5) -> list[str]:
        # Grandchildren may hold the pipe open; never wait for them long.
        self._thread.join(timeout)
        return list(self.lines)


# How long one readiness probe may wait for /health's answer. SGLang 0.5.17's /health (and
# /health_generate) is one handler: once the server is up it queues a one-token generation,
# sleeps a whole second, and only then answers 200 (503 at once while it is starting); a stuck
# scheduler gets its 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s). A probe capped at the poll
# interval never saw the 200 on a GPU (gpu-results.md §33: no serve log of any GPU run says
# "ready after": no READY=1, no freezeGc), so it waits past SGLang's own limit.
HEALTH_PROBE_TIMEOUT_S = 30.0


def probe_health(host: str, port: int, timeout: float) -> int | None:
    """HTTP status of GET /health, or None when nothing answers."""
    try:
        return health(Endpoint("http", health_host(host), port), timeout)
    except OSError:
        return None


def port_in_use(host: str, port: int, timeout: float = 1.0) -> bool:
    """Something already accepts on host:port: its /health would pass for ours."""
    try:
        with socket.create_connection((health_host(host), port), timeout=timeout):
            return True
    except OSError:
        return False


class Supervisor:
    """Owns the child process, its stderr tail and the signals aimed at it."""

    def __init__(self, cfg: InstanceConfig, argv: list[str], env: dict[str, str],
                 grace: float = TERM_GRACE_S) -> None:
        self.cfg = cfg
        self.grace = grace
        self.signalled: int | None = None
        self.signalled_at = 0.0
        self.killed = False  # serve itself SIGKILLed the child (grace ran out)
        self.foreign_said = False  # told once that another process answers on the port
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            process_group=0,  # our forwarding is the only signal it gets from a terminal
            preexec_fn=_die_with_parent,
        )
        self.tail = StderrTail(self.proc.stderr)

    def forward(self, signum: int, _frame=None) -> None:
        if self.signalled is None:
            self.signalled_at = time.monotonic()
        self.signalled = signum
        sdnotify.notify("STOPPING=1\nSTATUS=stopping (forwarded signal)")
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signum)

    def wait_ready(self, interval: float, timeout: float) -> bool | None:
        """True when healthy, False when the child exited, None on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                return False
            if self.signalled is None:
                status = probe_health(self.cfg.host, self.cfg.port, HEALTH_PROBE_TIMEOUT_S)
                if status == 200 and self.answered_by_child():
                    return True
            elif time.monotonic() - self.signalled_at > self.grace:
                return None
            if self.proc.poll() is not None:
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=min(interval, remaining))

    def answered_by_child(self) -> bool:
        """Whether the socket that answered is the child's (or /proc cannot tell): a server
        that bound the port after our start-up check must not pass for ours (§34)."""
        verdict = portowner.listener(self.cfg.port, self.proc.pid)
        if verdict.ours is not False:
            return True
        if not self.foreign_said:
            who = ", ".join(f"pid {p}" for p in verdict.others) or "another process"
            _err(f"{self.cfg.host}:{self.cfg.port} answers /health from {who}, not this "
                 "instance's SGLang (a stale server on the port?); waiting for ours")
            self.foreign_said = True
        return False

    def wait_exit(self) -> int:
        """Wait for the child; once a signal was forwarded, kill it after the grace period."""
        while True:
            try:
                return self.proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                if self.signalled is not None and (
                    time.monotonic() - self.signalled_at > self.grace
                ):
                    self.kill()

    def kill(self) -> None:
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    def stopped(self) -> int:
        """serve's exit code after a forwarded signal stopped the child."""
        self.tail.finish()
        outcome = stop_outcome(self.proc.returncode, self.signalled, self.killed)
        if outcome.note:
            _err(outcome.note)
        return outcome.code

    def stop(self) -> int:
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.wait()


def freeze_gc_target(cfg: InstanceConfig) -> bool:
    """Whether serve freezes this instance's collectors once it is ready: ``freezeGc`` on, and
    this host runs the HTTP server (a multi-node rank other than 0 has none)."""
    return cfg.freeze_gc and (cfg.multi_node is None or cfg.multi_node.node_rank == 0)


def freeze_after_ready(cfg: InstanceConfig, key: str | None,
                       timeout: float = FREEZE_GC_TIMEOUT_S) -> str:
    """POST SGLang's /freeze_gc once /health answers (SGLang has run its own warm-up request
    by then): every object alive after the start (imports, weights' wrappers, CUDA graphs)
    leaves the collectors' full passes. Without it each server stalled every request in flight
    once, ~0.4 s, at its first full collection (H100: 3 of 5 c = 8 levels in §28 against none
    of 5 with the freeze in §32, docs/gpu-results.md). The line serve logs; a server that
    refuses is still served (the freeze is a latency fix, not a condition of serving)."""
    ep = Endpoint("http", health_host(cfg.host), cfg.port, "", key)
    why = post_freeze_gc(ep, timeout)
    if why is None:
        return "froze SGLang's garbage collectors after its warm-up (freezeGc; POST /freeze_gc)"
    return f"could not freeze SGLang's garbage collectors (freezeGc): {why}; serving without it"


def _report_death(sup: Supervisor, when: str) -> None:
    code = sup.proc.returncode
    lines = sup.tail.finish()
    _err(f"SGLang exited with code {exit_code(code)} {when}; its last stderr lines:")
    for line in lines or ["(no stderr output)"]:
        print(f"  | {line}", file=sys.stderr)
    sys.stderr.flush()


def supervise(cfg: InstanceConfig, interval: float, environ: dict[str, str],
              grace: float = TERM_GRACE_S) -> int:
    cache = environ.get("CACHE_DIRECTORY", "").split(":")[0]
    if cfg.cache_dir is None and cache:
        # systemd's CacheDirectory= (the non-NixOS unit leaves cacheDir unset)
        cfg = dataclasses.replace(cfg, cache_dir=cache)
    key = read_api_key(cfg, environ)
    argv = child_command(cfg)
    env = dict(environ)
    for k in config_unset_env(cfg):
        env.pop(k, None)
    env.update(render_env(cfg))
    where = f"{cfg.host}:{cfg.port}"
    # From before the key file exists: a stop signal must reach the cleanup in `finally`.
    pending: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _f: pending.append(signum))
                for s in (signal.SIGTERM, signal.SIGINT)}
    key_path: Path | None = None
    sup: Supervisor | None = None
    try:
        try:
            key_path = write_key_config(key, environ) if key is not None else None
        except OSError as e:
            _err(f"cannot write the API key config for SGLang: {e.strerror or e} "
                 f"({e.filename or 'temporary directory'})")
            return 1
        if key_path is not None:
            argv += ["--config", str(key_path)]
        if port_in_use(cfg.host, cfg.port):
            _err(f"something already listens on {where}; another instance or a stale server?")
            return 1
        if pending:
            _err(f"{signal.Signals(pending[0]).name} before SGLang started; not starting it")
            return exit_code(-pending[0])
        try:
            sup = Supervisor(cfg, argv, env, grace)
        except (OSError, ValueError) as e:  # ValueError: a NUL byte in argv or the environment
            _err(f"cannot start {argv[0]}: {getattr(e, 'strerror', None) or e}")
            return 1
        for s in previous:
            signal.signal(s, sup.forward)
        if pending:  # arrived while the child was being spawned
            sup.forward(pending[0])
        sdnotify.notify(f"STATUS=starting SGLang ({cfg.algorithm}) on {where}", environ)
        started = time.monotonic()
        ready = sup.wait_ready(interval, cfg.start_timeout)
        remove_key_config(key_path)
        if ready is False:
            if sup.signalled is not None:
                return sup.stopped()
            _report_death(sup, "before it was ready")
            sdnotify.notify("STATUS=SGLang died before it was ready", environ)
            return exit_code(sup.proc.returncode) or 1
        if ready is None and sup.signalled is not None:
            sup.kill()
            sup.proc.wait()
            return sup.stopped()
        if ready is None:
            _err(
                f"SGLang did not answer /health on {where} within startTimeout="
                f"{cfg.start_timeout}s; stopping it (raise startTimeout for a first start "
                "that compiles kernels or downloads weights)"
            )
            sup.stop()
            _report_death(sup, "after the start timeout")
            return 1
        took = time.monotonic() - started
        if sup.signalled is None and freeze_gc_target(cfg):
            _err(freeze_after_ready(cfg, key))
        status = f"serving {cfg.served_model_name or cfg.model} ({cfg.algorithm}) on {where}"
        if sup.signalled is None:  # a stop that raced the last probe: no READY after STOPPING
            sdnotify.notify(f"READY=1\nSTATUS={status}", environ)
            _err(f"ready after {took:.1f}s: {status}")
        code = sup.wait_exit()
        if sup.signalled is None:
            _report_death(sup, "after it was ready")
            return exit_code(code) or 1
        return sup.stopped()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        remove_key_config(key_path)
        if sup is not None and sup.proc.poll() is None:
            sup.stop()
