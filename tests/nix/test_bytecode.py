"""Stale bytecode after patching a wheel-installed package, and the fix.

Reproduces what the pyproject.nix wheel hook does, with real files: `uv pip install
--compile-bytecode` compiles every .py with uv's compileall helper (invalidation mode
from PYC_INVALIDATION_MODE, else py_compile's default, which is CHECKED_HASH because Nix
sets SOURCE_DATE_EPOCH); then our postInstall patches sources. Shows that the pycs go
stale, that CPython runs the OLD code when hash-based pycs are not checked, and that
pkgs/sglang-dflash/apply-patches.sh (what overlays/ddtree.nix runs) fixes both."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nix.nixtools import REPO

SCRIPT = REPO / "pkgs" / "sglang-dflash" / "apply-patches.sh"
NIX_EPOCH = "315532800"  # SOURCE_DATE_EPOCH in nixpkgs' stdenv (1980-01-01)

# uv's compile helper (crates/uv-installer/src/pip_compileall.py, as shipped in uv 0.13.9),
# reduced to what decides the pyc format: the invalidation mode and force.
UV_COMPILE = """
import compileall, os, py_compile, sys
mode = os.environ.get("PYC_INVALIDATION_MODE")
mode = py_compile.PycInvalidationMode[mode] if mode else py_compile._get_default_invalidation_mode()
force = mode != py_compile.PycInvalidationMode.TIMESTAMP
for path in sys.argv[1:]:
    assert compileall.compile_file(path, invalidation_mode=mode, force=force, quiet=2)
"""

PATCH = """\
--- a/pkgx/mod.py
+++ b/pkgx/mod.py
@@ -1,2 +1,2 @@
 def value():
-    return "upstream"
+    return "patched by the DDTree overlay"
--- /dev/null
+++ b/pkgx/added.py
@@ -0,0 +1 @@
+ADDED = True
"""


def nix_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYC_INVALIDATION_MODE"}
    env["SOURCE_DATE_EPOCH"] = NIX_EPOCH
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(extra)
    return env


def install_wheel_tree(site: Path, **env: str) -> None:
    """An installed package as the wheel hook leaves it: sources plus compiled bytecode."""
    pkg = site / "pkgx"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text('def value():\n    return "upstream"\n')
    (pkg / "other.py").write_text("X = 1\n")
    files = [str(p) for p in sorted(pkg.glob("*.py"))]
    subprocess.run([sys.executable, "-c", UV_COMPILE, *files], env=nix_env(**env), check=True)


def pyc_of(source: Path) -> Path:
    return Path(importlib.util.cache_from_source(str(source)))


def pyc_flags_and_hash(pyc: Path) -> tuple[int, bytes]:
    data = pyc.read_bytes()
    return int.from_bytes(data[4:8], "little"), data[8:16]


def is_current(source: Path) -> bool:
    """The pyc records the hash of the source as it is now."""
    _flags, recorded = pyc_flags_and_hash(pyc_of(source))
    return recorded == importlib.util.source_hash(source.read_bytes())


def run_value(site: Path, check_pycs: str = "default") -> str:
    """What `pkgx.mod.value()` returns in a fresh interpreter using that site dir.

    The Nix store is read-only, so CPython cannot rewrite a pyc there; these tests may run
    as root (which ignores file modes), so PYTHONDONTWRITEBYTECODE models the store."""
    proc = subprocess.run(
        [sys.executable, "--check-hash-based-pycs", check_pycs, "-c",
         "import pkgx.mod; print(pkgx.mod.value())"],
        env=nix_env(PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1"),
        capture_output=True, text=True, check=True)
    return proc.stdout.strip()


@pytest.fixture
def patch_file(tmp_path: Path) -> Path:
    p = tmp_path / "0001-ddtree.patch"
    p.write_text(PATCH)
    return p


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return tmp_path / "site-packages"


def test_nix_builds_compile_checked_hash_pycs(site: Path):
    install_wheel_tree(site)
    flags, _ = pyc_flags_and_hash(pyc_of(site / "pkgx" / "mod.py"))
    assert flags == 0b11  # hash-based, checked (PEP 552)
    assert is_current(site / "pkgx" / "mod.py")


def test_patching_after_install_leaves_stale_bytecode(site: Path, patch_file: Path):
    install_wheel_tree(site)
    subprocess.run(["patch", "--batch", "-p1", "-d", str(site), "-i", str(patch_file)],
                   check=True, capture_output=True)
    mod = site / "pkgx" / "mod.py"
    assert not is_current(mod)
    # Checked pycs: CPython notices and compiles in memory, but cannot fix the store file,
    # so every start pays for it and the pyc stays stale.
    assert run_value(site) == "patched by the DDTree overlay"
    assert not is_current(mod)
    # Unchecked hash pycs (PYC_INVALIDATION_MODE=UNCHECKED_HASH or this flag): the OLD code runs.
    assert run_value(site, "never") == "upstream"


def test_apply_patches_recompiles_what_it_patched(site: Path, patch_file: Path):
    install_wheel_tree(site)
    other_pyc = pyc_of(site / "pkgx" / "other.py")
    other_before = other_pyc.read_bytes()
    proc = subprocess.run(["bash", str(SCRIPT), str(site), sys.executable, str(patch_file)],
                          env=nix_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert is_current(site / "pkgx" / "mod.py")
    assert is_current(site / "pkgx" / "added.py")  # a file the patch creates gets bytecode
    assert other_pyc.read_bytes() == other_before  # untouched files keep theirs
    assert pyc_flags_and_hash(pyc_of(site / "pkgx" / "mod.py"))[0] == 0b11
    assert run_value(site) == "patched by the DDTree overlay"
    assert run_value(site, "never") == "patched by the DDTree overlay"


def test_apply_patches_keeps_the_invalidation_mode_uv_used(site: Path, patch_file: Path):
    install_wheel_tree(site, PYC_INVALIDATION_MODE="UNCHECKED_HASH")
    mod = site / "pkgx" / "mod.py"
    assert pyc_flags_and_hash(pyc_of(mod))[0] == 0b01
    subprocess.run(["bash", str(SCRIPT), str(site), sys.executable, str(patch_file)],
                   env=nix_env(PYC_INVALIDATION_MODE="UNCHECKED_HASH"), check=True,
                   capture_output=True)
    assert pyc_flags_and_hash(pyc_of(mod))[0] == 0b01
    assert is_current(mod)
    assert run_value(site) == "patched by the DDTree overlay"


def test_apply_patches_removes_optimized_bytecode_too(site: Path, patch_file: Path):
    install_wheel_tree(site)
    mod = site / "pkgx" / "mod.py"
    opt = Path(importlib.util.cache_from_source(str(mod), optimization=1))
    shutil.copy(pyc_of(mod), opt)  # stale opt-1 pyc, as `python -O` would have used
    subprocess.run(["bash", str(SCRIPT), str(site), sys.executable, str(patch_file)],
                   env=nix_env(), check=True, capture_output=True)
    assert not opt.exists()


def test_apply_patches_fails_on_a_patch_that_does_not_apply(site: Path, tmp_path: Path):
    install_wheel_tree(site)
    bad = tmp_path / "bad.patch"
    bad.write_text(PATCH.replace('return "upstream"', 'return "something else"'))
    proc = subprocess.run(["bash", str(SCRIPT), str(site), sys.executable, str(bad)],
                          env=nix_env(), capture_output=True, text=True)
    assert proc.returncode != 0


def test_apply_patches_usage_error():
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr
