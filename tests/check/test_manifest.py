"""The committed manifest is current, and `sglang-dflash manifest` notices drift."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sglang_dflash import manifest as mf
from sglang_dflash.pins import load_pins

WHEEL = (Path.home() / ".cache" / "sglang-dflash" / "wheels"
         / "sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl")


def run_manifest(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang_dflash", "manifest", *args],
                          capture_output=True, text=True, timeout=60)


def test_committed_manifest_is_current() -> None:
    committed = mf.load_manifest()
    overlay = mf.parse_overlay((mf.PACKAGE_DIR / mf.OVERLAY_FILE).read_text())
    fresh = mf.build_manifest(load_pins(), overlay, mf.PACKAGE_DIR)
    reasons = mf.stale_reasons(committed, fresh)
    assert not reasons, "manifest.json is stale (" + "; ".join(reasons) + "): " + mf.FIX_STALE


def test_overlay_globs_pick_up_the_overlay_files() -> None:
    files = mf.load_manifest().overlay_files
    assert any(f.startswith("ddtree/") for f in files), files
    assert all(len(h) == 64 for h in files.values())


def copy_root(tmp_path: Path) -> Path:
    root = tmp_path / "pkg"
    shutil.copytree(mf.PACKAGE_DIR, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_check_names_what_is_stale_and_write_fixes_it(tmp_path: Path) -> None:
    root = copy_root(tmp_path)
    assert run_manifest("--write", "--root", str(root)).returncode == 0  # whatever the tree is
    assert run_manifest("--check", "--root", str(root)).returncode == 0
    victim = sorted(mf.load_manifest(root / "manifest.json").overlay_files)[0]
    (root / victim).write_text((root / victim).read_text() + "\n# changed\n")
    (root / "ddtree" / "brand_new.py").write_text("X = 1\n")
    (root / "plugin.py").unlink(missing_ok=True)
    p = run_manifest("--check", "--root", str(root))
    assert p.returncode == 1
    assert f"overlay file changed: {victim}" in p.stdout
    assert "overlay file added: ddtree/brand_new.py" in p.stdout
    assert "fix: run `sglang-dflash manifest --write`" in p.stdout
    w = run_manifest("--write", "--root", str(root))
    assert w.returncode == 0 and "wrote" in w.stdout
    assert run_manifest("--check", "--root", str(root)).returncode == 0
    assert "already up to date" in run_manifest("--write", "--root", str(root)).stdout


def test_overlay_toml_change_is_stale(tmp_path: Path) -> None:
    root = copy_root(tmp_path)
    run_manifest("--write", "--root", str(root))
    text = (root / "overlay.toml").read_text()
    (root / "overlay.toml").write_text(text.replace(
        '"sglang.srt.plugins.hook_registry",', '"sglang.srt.plugins.hook_registry",\n'
        '    "sglang.srt.extra_module",'))
    p = run_manifest("--check", "--root", str(root))
    assert p.returncode == 1 and "required_modules differ from overlay.toml" in p.stdout


def test_bad_inputs_exit_2_or_1(tmp_path: Path) -> None:
    root = copy_root(tmp_path)
    (root / "overlay.toml").write_text("not = [toml")
    p = run_manifest("--check", "--root", str(root))
    assert p.returncode == 2 and p.stderr.startswith("sglang-dflash manifest:")
    root = copy_root(tmp_path / "again")
    (root / "manifest.json").write_text("{}")
    p = run_manifest("--check", "--root", str(root))
    assert p.returncode == 1 and "schema None" in p.stdout


def test_patches_need_a_patched_root(tmp_path: Path) -> None:
    root = copy_root(tmp_path)
    (root / "patches").mkdir()
    (root / "patches" / "0001-x.patch").write_text("--- a\n+++ b\n")
    text = (root / "overlay.toml").read_text().replace(
        "patches = []", 'patches = [{ patch = "patches/0001-x.patch", '
        'changes = ["sglang/srt/server_args.py"] }]')
    (root / "overlay.toml").write_text(text)
    p = run_manifest("--write", "--root", str(root))
    assert p.returncode == 2 and "give --patched-root" in p.stderr
    patched = tmp_path / "site"
    (patched / "sglang" / "srt").mkdir(parents=True)
    (patched / "sglang" / "srt" / "server_args.py").write_text("# patched\n")
    p = run_manifest("--write", "--root", str(root), "--patched-root", str(patched))
    assert p.returncode == 0, p.stderr
    m = mf.load_manifest(root / "manifest.json")
    assert list(m.patched_files) == ["sglang/srt/server_args.py"]
    assert m.patches[0]["patch"] == "patches/0001-x.patch"


def test_required_modules_exist_in_the_real_wheel() -> None:
    """overlay.toml names only modules that the pinned sglang wheel really ships."""
    if not WHEEL.exists():
        pytest.skip(f"{WHEEL} not downloaded (tests/check/test_integration.py fetches it)")
    names = set(zipfile.ZipFile(WHEEL).namelist())
    for mod in mf.load_manifest().required_modules:
        base = mod.replace(".", "/")
        assert f"{base}.py" in names or f"{base}/__init__.py" in names, mod
