"""Running Nix 2.8's evaluator from tests: pure helpers, one subprocess call each.

Debian's Nix 2.8 cannot evaluate current nixpkgs (which needs Nix >= 2.18), so the tests
evaluate builtins-only files directly and, when checkouts are given by environment
variables, nixpkgs' lib, uv2nix and pyproject.nix (lib-level code only).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
NIX_INSTANTIATE = shutil.which("nix-instantiate")

# Checkouts (exported snapshots) used for lib-level evaluation; see docs/nix.md.
DEP_VARS = {
    "nixpkgs-lib": "SGLANG_DFLASH_NIXPKGS_LIB",
    "uv2nix": "SGLANG_DFLASH_UV2NIX",
    "pyproject-nix": "SGLANG_DFLASH_PYPROJECT_NIX",
}


@dataclass(frozen=True)
class EvalError(Exception):
    """nix-instantiate failed; `stderr` carries Nix's message."""

    stderr: str

    def __str__(self) -> str:
        return self.stderr


def require_nix() -> str:
    if NIX_INSTANTIATE is None:
        pytest.skip("nix-instantiate is not installed (apt-get install nix-bin)")
    return NIX_INSTANTIATE


def require_dep(name: str) -> Path:
    """The checkout named by its environment variable, or skip saying which is missing."""
    var = DEP_VARS[name]
    value = os.environ.get(var)
    if not value:
        pytest.skip(f"{var} is not set (a {name} checkout; docs/nix.md says how to get one)")
    path = Path(value)
    if not path.is_dir():
        pytest.skip(f"{var}={value} is not a directory")
    return path


def nix_literal(value: Any) -> str:
    """A Nix expression for a JSON-like Python value (paths stay strings)."""
    if isinstance(value, Path):
        return str(value.resolve())
    return json.dumps(value)


def nix_eval(expr: str, *, timeout: float = 120.0) -> Any:
    """Evaluate a Nix expression strictly and return its value as JSON."""
    cmd = [require_nix(), "--eval", "--strict", "--json", "-E", expr]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if proc.returncode != 0:
        raise EvalError(proc.stderr.strip())
    return json.loads(proc.stdout)


def nix_parse(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_nix(), "--parse", str(path)], capture_output=True, text=True,
                          timeout=60)


def nar_hash_sri(path: Path) -> str:
    """The narHash (SRI sha256) of a directory, as flake.lock records it."""
    nix_hash = shutil.which("nix-hash")
    if nix_hash is None:
        pytest.skip("nix-hash is not installed")
    proc = subprocess.run([nix_hash, "--type", "sha256", str(path)], capture_output=True,
                          text=True, check=True, timeout=300)
    import base64

    return "sha256-" + base64.b64encode(bytes.fromhex(proc.stdout.strip())).decode()
