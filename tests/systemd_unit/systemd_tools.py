"""Shared by the unit tests that hand a rendered unit to systemd's own `systemd-analyze verify`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

NEWER_KEYS = ("RestartSteps", "RestartMaxDelaySec")  # systemd >= 254; Debian 12 has 252


def package_prefix(prefix: Path) -> Path:
    """A package prefix whose bin/sglang-dflash exists and is executable (verify checks
    ExecStart's executable); returns the executable."""
    (prefix / "bin").mkdir(parents=True)
    exe = prefix / "bin" / "sglang-dflash"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return exe


def analyze_verify(unit: Path, cwd: Path) -> tuple[int, list[str], str]:
    """(exit code, reported lines other than keys newer than this systemd, all output) of
    `systemd-analyze verify`; SKIP when systemd-analyze is not installed."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    r = subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True,
                       text=True, timeout=60, cwd=cwd)
    output = r.stdout + r.stderr
    problems = [ln for ln in output.splitlines()
                if ln.strip() and not any(f"Unknown key '{k}'" in ln for k in NEWER_KEYS)]
    return r.returncode, problems, output
