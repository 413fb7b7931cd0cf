"""overlays/ddtree.nix: the shell it adds to the sglang and sglang-dflash builds, rendered by
Nix (lib level) and run with bash against real directory trees.

Needs SGLANG_DFLASH_NIXPKGS_LIB (the overlay uses nixpkgs' lib)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nix.nixtools import REPO, nix_eval, nix_literal, require_dep

SITE = "lib/python3.12/site-packages"


def render(attr: str, patches: list[Path]) -> str:
    lib = require_dep("nixpkgs-lib")
    patch_list = " ".join(
        f'{{ name = "{p.name}"; path = "{p}"; }}' for p in patches)
    # Paths as strings: `nix-instantiate --eval` names store paths without copying to them.
    return nix_eval(f"""
      let
        lib = import {nix_literal(lib)}/lib;
        overlay = import {nix_literal(REPO / "overlays/ddtree.nix")} {{
          inherit lib; pins = {{ }}; patches = [ {patch_list} ];
          applyPatches = "{REPO / 'pkgs/sglang-dflash/apply-patches.sh'}";
        }};
        drv = a: a // {{ overrideAttrs = f: a // f a; }};
        final = {{ python = {{ sitePackages = "{SITE}"; interpreter = "{sys.executable}"; }}; }};
        out = overlay final {{ sglang = drv {{ }}; sglang-dflash = drv {{ }}; }};
      in out.{attr}.postInstall
    """)


def run_post_install(script: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script],
                          env={**os.environ, "out": str(out)}, capture_output=True, text=True)


def wheel_layout(out: Path, files: tuple[str, ...], entry_points: str | None) -> None:
    site = out / SITE
    (site / "sglang_dflash").mkdir(parents=True)
    for f in files:
        (site / "sglang_dflash" / f).write_text("{}")
    dist = site / "sglang_dflash-0.1.0.dist-info"
    dist.mkdir()
    if entry_points is not None:
        (dist / "entry_points.txt").write_text(entry_points)


GOOD_EP = "[console_scripts]\nsglang-dflash = sglang_dflash.cli:main\n\n" \
          "[sglang.srt.plugins]\nddtree = sglang_dflash.plugin:register\n"


def test_plugin_build_accepts_a_complete_wheel(tmp_path: Path):
    wheel_layout(tmp_path, ("pins.toml", "overlay.toml", "manifest.json"), GOOD_EP)
    proc = run_post_install(render("sglang-dflash", []), tmp_path)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("files,eps,reason", [
    (("pins.toml", "overlay.toml"), GOOD_EP, "manifest.json is not installed"),
    (("pins.toml", "overlay.toml", "manifest.json"), "[console_scripts]\nx = y:z\n",
     "entry point is missing"),
])
def test_plugin_build_fails_without_manifest_or_entry_point(tmp_path, files, eps, reason):
    wheel_layout(tmp_path, files, eps)
    proc = run_post_install(render("sglang-dflash", []), tmp_path)
    assert proc.returncode == 1 and reason in proc.stderr


def test_plugin_build_skips_the_check_for_an_editable_install(tmp_path: Path):
    site = tmp_path / SITE
    site.mkdir(parents=True)
    (site / "_sglang_dflash.pth").write_text(str(REPO / "src"))
    proc = run_post_install(render("sglang-dflash", []), tmp_path)
    assert proc.returncode == 0 and "editable" in proc.stdout


def test_no_patches_means_sglang_is_untouched():
    assert render("sglang", []) == ""


def test_sglang_build_applies_the_series_and_recompiles(tmp_path: Path):
    site = tmp_path / SITE
    (site / "sglang" / "srt").mkdir(parents=True)
    target = site / "sglang" / "srt" / "spec.py"
    target.write_text("ALGOS = ['DFLASH']\n")
    patch = tmp_path / "0001-ddtree.patch"
    patch.write_text("--- a/sglang/srt/spec.py\n+++ b/sglang/srt/spec.py\n@@ -1 +1 @@\n"
                     "-ALGOS = ['DFLASH']\n+ALGOS = ['DFLASH', 'DDTREE']\n")
    proc = run_post_install(render("sglang", [patch]), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "DDTREE" in target.read_text()
    pyc = json.dumps(sorted(p.name for p in (target.parent / "__pycache__").glob("*.pyc")))
    assert "spec.cpython-" in pyc
