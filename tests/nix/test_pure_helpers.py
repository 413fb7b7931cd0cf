"""The builtins-only Nix helpers, evaluated with Nix 2.8 against real files.

nix/pins.nix must agree with the Python reader of the same pins.toml (one source of
truth); nix/patches.nix must find exactly the patch files, in apply order."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from sglang_dflash.pins import load_pins, parse_pins
from tests.nix.nixtools import REPO, EvalError, nix_eval, nix_literal

PINS_NIX = REPO / "nix" / "pins.nix"
PATCHES_NIX = REPO / "nix" / "patches.nix"


def eval_pins(pins_file: Path) -> dict:
    return nix_eval(f"import {nix_literal(PINS_NIX)} {{ pinsFile = {nix_literal(pins_file)}; }}")


def test_pins_nix_reads_the_shipped_pins_like_python():
    got = eval_pins(REPO / "src" / "sglang_dflash" / "pins.toml")
    pins = load_pins()
    assert got["distributions"] == pins.distributions
    assert got["cuda"]["version"] == pins.cuda_version
    assert got["python"]["package"] == pins.python_package
    assert got["lockstep"] == pins.lockstep
    assert got["sglangVersion"] == pins.version("sglang")


def test_pins_nix_derives_attribute_names_from_the_file(tmp_path: Path):
    """Change the pins, and the nixpkgs attributes the package uses follow."""
    text = (REPO / "src" / "sglang_dflash" / "pins.toml").read_text()
    text = text.replace('version = "13.0"', 'version = "13.1"').replace(
        'package = "3.12"', 'package = "3.13"').replace('sglang = "0.5.17"', 'sglang = "0.5.99"')
    other = tmp_path / "pins.toml"
    other.write_text(text)
    parsed = parse_pins(text)
    got = eval_pins(other)
    assert parsed.cuda_version == "13.1" and parsed.python_package == "3.13"
    assert got["cudaPackagesAttr"] == "cudaPackages_13_1"
    assert got["pythonAttr"] == "python313"
    assert got["patchDirName"] == "sglang-0.5.99"


def test_pins_nix_fails_on_a_broken_pins_file(tmp_path: Path):
    bad = tmp_path / "pins.toml"
    bad.write_text("[python]\npackage = \"3.12\"\n")  # no [cuda]
    with pytest.raises(EvalError, match="cuda"):
        nix_eval(f"(import {nix_literal(PINS_NIX)} {{ pinsFile = {nix_literal(bad)}; }})"
                 ".cudaPackagesAttr")


def eval_patches(root: Path, dir_name: str) -> list[str]:
    return nix_eval(
        f"map (p: p.name) (import {nix_literal(PATCHES_NIX)} "
        f"{{ patchesRoot = {nix_literal(root)}; dirName = {nix_literal(dir_name)}; }})")


def test_patches_nix_lists_patch_files_in_name_order(tmp_path: Path):
    series = tmp_path / "sglang-0.5.17"
    series.mkdir()
    for name in ("0002-tree-mask.patch", "0001-hooks.patch", "0010-walk.patch", "README.md",
                 "notes.patch.orig"):
        (series / name).write_text("x\n")
    (series / "sub.patch").mkdir()  # a directory named like a patch is not one
    assert eval_patches(tmp_path, "sglang-0.5.17") == [
        "0001-hooks.patch", "0002-tree-mask.patch", "0010-walk.patch"]


def test_patches_nix_absent_or_empty_directory_is_an_empty_series(tmp_path: Path):
    assert eval_patches(tmp_path, "sglang-0.5.17") == []
    (tmp_path / "sglang-0.5.17").mkdir()
    assert eval_patches(tmp_path, "sglang-0.5.17") == []


def test_patches_nix_on_the_repository_matches_the_directory():
    pins = load_pins()
    series = REPO / "overlays" / "patches" / f"sglang-{pins.version('sglang')}"
    expected = sorted(p.name for p in series.glob("*.patch") if p.is_file()) \
        if series.is_dir() else []
    assert eval_patches(REPO / "overlays" / "patches", f"sglang-{pins.version('sglang')}") \
        == expected


def test_overlay_toml_and_the_nix_series_name_the_same_patches():
    """The manifest (overlay.toml `patches`) and the Nix build (nix/patches.nix) must agree
    on the series, or the check would verify files the build did not patch."""
    overlay_toml = REPO / "src" / "sglang_dflash" / "overlay.toml"
    if not overlay_toml.exists():
        pytest.skip("src/sglang_dflash/overlay.toml is not written yet")
    declared = sorted(Path(p["patch"]).name
                      for p in tomllib.loads(overlay_toml.read_text())["overlay"]["patches"])
    pins = load_pins()
    built = eval_patches(REPO / "overlays" / "patches", f"sglang-{pins.version('sglang')}")
    assert declared == built
