"""The rendered unit under a real systemd: PID 1 of throwaway namespaces, the SGLang stand-in.

`sglang-dflash unit` output is started, checked and stopped by systemd 252 itself (not by
`systemd-analyze`): Type=notify readiness from `serve`, the status line, the hardening block as
systemd applies it (DynamicUser, PrivateTmp, ProtectSystem=strict, the syscall filter, ...),
KillMode=mixed with SGLang's self-SIGKILL at the end of a graceful stop, and Restart= after a
start-up crash. `systemd_ns_boot.sh` isolates the manager from the host first (see there).

Needs root, `unshare`/`nsenter` and /lib/systemd/systemd; skipped with the reason otherwise,
or when systemd cannot boot in this container at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BOOT = Path(__file__).with_name("systemd_ns_boot.sh")
SYSTEMD = Path("/lib/systemd/systemd")
CGROUP = Path("/sys/fs/cgroup/systemd")  # cgroup v1 name=systemd: the manager's own tree
PYTHON = "/usr/bin/python3"  # the CLI and the stand-in are stdlib-only; a venv may sit in /tmp


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (namespaces, systemd as PID 1)"
    if not SYSTEMD.exists():
        return f"no {SYSTEMD}"
    if not Path(PYTHON).exists():
        return f"no {PYTHON}"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH"
    return None


class NamespacedSystemd:
    """A systemd PID 1 in new PID/mount/UTS/IPC/network namespaces; ``sh`` runs a command
    inside."""

    def __init__(self, testdir: Path) -> None:
        self.cgroups_before = self._cgroups()
        self.proc = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount", "--uts", "--ipc", "--net", "--mount-proc",
             "bash", str(BOOT), str(testdir), str(REPO)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.pid = self._child()

    def _child(self) -> int | None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.proc.poll() is None:
            kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
            text = kids.read_text().split() if kids.exists() else []
            if text:
                return int(text[0])
            time.sleep(0.05)
        return None

    def sh(self, cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["nsenter", "-t", str(self.pid), "-m", "-p", "-u", "-i", "-n", "sh", "-c", cmd],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def wait_booted(self, timeout: float = 30) -> str:
        state = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.pid and self.proc.poll() is None:
            state = self.sh("systemctl is-system-running 2>&1", timeout=10).stdout.strip()
            if state in ("running", "degraded"):
                return state
            time.sleep(0.2)
        return state or "no answer"

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.sh(f"systemctl show -p {','.join(props)} {unit}").stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    @staticmethod
    def _cgroups() -> set[Path]:
        return {p for p in CGROUP.rglob("*") if p.is_dir()} if CGROUP.is_dir() else set()

    def close(self) -> str:
        if self.pid:
            os.kill(self.pid, signal.SIGKILL)  # PID 1 of the namespace: everything in it goes
        try:
            out, _ = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            out, _ = self.proc.communicate()
        # the manager's (now empty) cgroups, deepest first: leave the host's tree as found
        for cg in sorted(self._cgroups() - self.cgroups_before, key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                cg.rmdir()
        return out.decode(errors="replace") if out else ""


def _instance(testdir: Path, name: str, port: int, environment: dict[str, str]) -> None:
    cfg = json.loads((REPO / "examples" / "dummy-qwen3-1.7b-ddtree.json").read_text())
    cfg |= {"name": name, "port": port, "startTimeout": 30, "environment": environment,
            "model": "/srv/t/models/target", "draftModel": "/srv/t/models/draft"}
    (testdir / f"{name}.json").write_text(json.dumps(cfg))


def make_testdir(tmp_path_factory, name: str, pythonpath: str) -> Path:
    """The test dir systemd sees as /srv/t (SKIP first when systemd cannot run here): stub
    model dirs, a driver-lib dir, and a package prefix whose bin/sglang-dflash runs this
    checkout's CLI with ``pythonpath``."""
    why = _why_not()
    if why:
        pytest.skip(why)
    t = tmp_path_factory.mktemp(name)
    for role in ("target", "draft"):
        (t / "models" / role).mkdir(parents=True)
        (t / "models" / role / "config.json").write_text("{}")
    (t / "drv").mkdir()
    wrapper = t / "prefix" / "bin" / "sglang-dflash"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(
        f"#!/bin/sh\nexport PYTHONPATH={pythonpath}\n"
        f'exec {PYTHON} -m sglang_dflash.cli "$@"\n'
    )
    wrapper.chmod(0o755)
    return t


def boot(t: Path) -> NamespacedSystemd:
    """Make ``t`` readable by the services' DynamicUsers and boot systemd over it; SKIP with
    the reason when systemd cannot boot here."""
    for p in [t, *t.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o055)
    for p in t.parents:
        if p == Path("/"):
            break
        p.chmod(p.stat().st_mode | 0o011)  # traversable (pytest's tmp dirs are 0700)
    sd = NamespacedSystemd(t)
    state = sd.wait_booted()
    if state not in ("running", "degraded"):
        log = sd.close()
        pytest.skip(f"systemd did not boot in namespaces here ({state}): {log[-300:]!r}")
    return sd


@pytest.fixture(scope="module")
def systemd(tmp_path_factory):
    t = make_testdir(tmp_path_factory, "systemd", "/srv/repo/tests/standin:/srv/repo/src")
    _instance(t, "ok", 30611, {"STANDIN_SELFKILL_ON_TERM": "1", "STANDIN_TOKEN_DELAY": "0"})
    _instance(t, "crash", 30612, {"STANDIN_CRASH_BEFORE_READY": "7"})
    sd = boot(t)
    for name in ("ok", "crash"):
        r = sd.sh(
            f"PYTHONPATH=/srv/repo/src {PYTHON} -m sglang_dflash.cli unit "
            f"--config /srv/t/{name}.json --package-path /srv/t/prefix --driver-lib-dir "
            f"/srv/t/drv -o /run/systemd/system/sglang-dflash-{name}.service"
        )
        assert r.returncode == 0, r.stderr
    assert sd.sh("systemctl daemon-reload").returncode == 0
    yield sd
    sd.close()


def test_notify_ready_hardened_and_clean_stop(systemd):
    unit = "sglang-dflash-ok.service"
    r = systemd.sh(f"systemctl start {unit}", timeout=90)
    log = systemd.sh(f"journalctl -u {unit} --no-pager").stdout
    assert r.returncode == 0, r.stderr + log
    st = systemd.show(unit, "Type", "ActiveState", "SubState", "StatusText", "DynamicUser",
                      "ProtectSystem", "PrivateTmp", "NoNewPrivileges", "MainPID")
    assert (st["Type"], st["ActiveState"], st["SubState"]) == ("notify", "active", "running")
    assert st["StatusText"].startswith("serving /srv/t/models/target (ddtree) on 127.0.0.1:30611")
    assert (st["DynamicUser"], st["ProtectSystem"], st["PrivateTmp"],
            st["NoNewPrivileges"]) == ("yes", "strict", "yes", "yes")  # fmt: skip
    # the service really runs confined: not root, /tmp private, / read-only
    pid = st["MainPID"]
    uid = systemd.sh(f"stat -c %u /proc/{pid}").stdout.strip()
    assert uid not in ("", "0"), uid
    probe = systemd.sh(
        f"{PYTHON} -c \"import urllib.request;"
        "print(urllib.request.urlopen('http://127.0.0.1:30611/health', timeout=5).status)\""
    )
    assert probe.stdout.strip() == "200", probe.stderr
    # SGLang SIGKILLs itself at the end of a graceful stop (the stand-in does it too); under
    # KillMode=mixed the unit must still end as a clean stop
    r = systemd.sh(f"systemctl stop {unit}", timeout=90)
    st = systemd.show(unit, "ActiveState", "Result", "ExecMainStatus")
    assert r.returncode == 0 and st == {"ActiveState": "inactive", "Result": "success",
                                        "ExecMainStatus": "0"}, (st, r.stderr)  # fmt: skip


def test_startup_crash_fails_the_start_and_restarts(systemd):
    unit = "sglang-dflash-crash.service"
    r = systemd.sh(f"systemctl start {unit}", timeout=90)
    assert r.returncode != 0  # Type=notify: the start job fails, it is not "active"
    log = systemd.sh(f"journalctl -u {unit} --no-pager").stdout
    assert "simulated failure while loading weights" in log, log
    deadline = time.monotonic() + 30
    restarts = 0
    while time.monotonic() < deadline and restarts < 1:
        restarts = int(systemd.show(unit, "NRestarts").get("NRestarts", "0") or 0)
        time.sleep(0.5)
    assert restarts >= 1, "Restart=on-failure did not restart the crashed instance"
    systemd.sh(f"systemctl stop {unit}")
