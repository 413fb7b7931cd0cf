"""Every .nix file in the repository parses, and the flake's outputs have the expected shape.

The shape is evaluated with stub inputs: the output names are attribute names, so no
nixpkgs value is forced (and Nix 2.8 can do it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.nix.nixtools import REPO, nix_eval, nix_literal, nix_parse

SKIP_DIRS = {".git", "node_modules", ".venv", "result"}


def nix_files() -> list[Path]:
    return sorted(
        p for p in REPO.rglob("*.nix")
        if not (set(p.relative_to(REPO).parts) & SKIP_DIRS)
    )


def test_there_are_nix_files_to_check():
    names = {p.relative_to(REPO).as_posix() for p in nix_files()}
    assert {"flake.nix", "overlays/default.nix", "pkgs/sglang-dflash/default.nix"} <= names


@pytest.mark.parametrize("path", nix_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_parses(path: Path):
    proc = nix_parse(path)
    assert proc.returncode == 0, proc.stderr


def test_parse_rejects_a_broken_file(tmp_path: Path):
    bad = tmp_path / "bad.nix"
    bad.write_text("{ a = 1; b = ; }\n")
    assert nix_parse(bad).returncode != 0


STUB_OUTPUTS = f"""
let
  flake = import {nix_literal(REPO / "flake.nix")};
  stub = {{ }};
  out = flake.outputs {{
    self = stub; nixpkgs = stub; pyproject-nix = stub; uv2nix = stub;
    pyproject-build-systems = stub;
  }};
  sys = "x86_64-linux";
in {{
  top = builtins.attrNames out;
  packages = builtins.attrNames out.packages.${{sys}};
  nixosModules = builtins.attrNames out.nixosModules;
  devShells = builtins.attrNames out.devShells.${{sys}};
  overlays = builtins.attrNames out.overlays;
  hasFormatter = out.formatter ? ${{sys}};
  hasChecks = out.checks ? ${{sys}};
  hasApps = out.apps ? ${{sys}};
  inputs = builtins.attrNames flake.inputs;
  follows = builtins.mapAttrs (_: i: builtins.mapAttrs (_: v: v.follows) (i.inputs or {{ }}))
    flake.inputs;
}}
"""


def test_flake_output_shape():
    shape = nix_eval(STUB_OUTPUTS)
    assert shape["top"] == sorted(
        ["apps", "checks", "devShells", "formatter", "nixosModules", "overlays", "packages"])
    assert shape["packages"] == ["default", "sglang-dflash", "sglang-dflash-check"]
    assert shape["nixosModules"] == ["default", "sglang-dflash"]
    assert shape["devShells"] == ["default"]
    assert shape["overlays"] == ["default"]
    assert shape["hasFormatter"] and shape["hasChecks"] and shape["hasApps"]


def test_every_input_follows_our_nixpkgs():
    shape = nix_eval(STUB_OUTPUTS)
    assert shape["inputs"] == ["nixpkgs", "pyproject-build-systems", "pyproject-nix", "uv2nix"]
    for name in ("pyproject-nix", "uv2nix", "pyproject-build-systems"):
        assert shape["follows"][name]["nixpkgs"] == "nixpkgs", name
    assert shape["follows"]["uv2nix"]["pyproject-nix"] == "pyproject-nix"
    assert shape["follows"]["pyproject-build-systems"] == {
        "nixpkgs": "nixpkgs", "pyproject-nix": "pyproject-nix", "uv2nix": "uv2nix"}


def test_checks_and_apps_names():
    """The checks and apps attribute sets, from their files with lazy stub arguments."""
    got = nix_eval(f"""
      let
        stub = {{ }};
        checks = import {nix_literal(REPO / "pkgs/checks/default.nix")} {{
          lib = stub; pkgs = stub; runCommand = stub; src = stub; sglang-dflash = stub;
          nixosSystem = stub; nixosModule = stub;
        }};
        apps = import {nix_literal(REPO / "pkgs/apps.nix")} {{
          lib = stub; writeShellApplication = _: stub; sglang-dflash = stub;
          sglang-dflash-check = stub;
        }};
      in {{ checks = builtins.attrNames checks; apps = builtins.attrNames apps; }}
    """)
    assert got["checks"] == ["format", "module-eval", "preflight", "pytest", "vm-standin"]
    assert got["apps"] == ["check", "serve"]


def test_no_import_from_derivation():
    """IFD shows up as import/readFile/fromJSON of a derivation output; none of our files
    read from a build result (only from the flake's own source)."""
    offenders = []
    for path in nix_files():
        text = path.read_text()
        for needle in ("import (pkgs.", "readFile (pkgs.", "builtins.readFile \"${", "import \"${"):
            if needle in text:
                offenders.append(f"{path.relative_to(REPO)}: {needle}")
    assert offenders == []
