"""The nixpkgs stand-in cannot drift silently, and the import direction holds.

- every `pkgs.<attr>` our Nix files touch, and every argument callPackage fills from pkgs
  in a file under pkgs/, is an attribute of tests/nix/nixpkgs-standin (evaluated with the
  real nixpkgs lib, SGLANG_DFLASH_NIXPKGS_LIB);
- flake.nix -> overlays/ -> pkgs/: no file under pkgs/ names a path under overlays/;
  nix/ holds pure helpers: no path into pkgs/ or overlays/, no pkgs/stdenv argument.
"""

from __future__ import annotations

import re
from pathlib import Path

from sglang_dflash.pins import load_pins
from tests.nix.nixtools import REPO, nix_eval, nix_literal, require_dep

OURS = [REPO / "flake.nix", *sorted((REPO / "pkgs").rglob("*.nix")),
        *sorted((REPO / "overlays").rglob("*.nix")), *sorted((REPO / "modules").rglob("*.nix"))]
# Arguments the callers pass explicitly (not from pkgs), with where they come from.
EXPLICIT = {
    "uv2nix", "pyproject-nix", "pyproject-build-systems", "workspaceRoot",  # overlays/default.nix
    "pins", "patches", "mkPythonOverlay", "cudaPackages",  # overlays/default.nix, sglang-dflash
    "src", "nixosSystem", "nixosModule", "example",  # flake.nix -> pkgs/checks
    "sglang-dflash", "sglang-dflash-check",  # the overlay's own packages
    "table", "applyPatches",  # defaults inside the files
}
PKGS_ATTR = re.compile(r"\bpkgs\.([A-Za-z_][A-Za-z0-9_'-]*)")
PATH_LIT = re.compile(r"(?<![\w/.$}])(\.\.?/[\w./-]+)")


def used_attrs() -> set[str]:
    names = set()
    for f in OURS:
        names |= set(PKGS_ATTR.findall(f.read_text()))
    callpackaged = [f for f in (REPO / "pkgs").rglob("*.nix")
                    if f.name not in ("gpu-wheels.nix", "fixups.nix")]
    args = nix_eval("[ " + " ".join(
        f"(builtins.attrNames (builtins.functionArgs (import {nix_literal(f)})))"
        for f in callpackaged) + " ]")
    for a in args:
        names |= set(a) - EXPLICIT
    # pkgs.${a} for the fixup table's native libraries (pkgs/sglang-dflash/fixups.nix)
    table = REPO / "pkgs/sglang-dflash/gpu-wheels.nix"
    names |= set(nix_eval(f"builtins.concatLists (map (e: e.pkgs or [ ]) (builtins.attrValues "
                          f"(import {nix_literal(table)}).native))"))
    pins = load_pins()
    names |= {"python" + pins.python_package.replace(".", ""),
              "cudaPackages_" + pins.cuda_version.replace(".", "_")}
    names -= {"lib", "pkgs", "sglang-dflash", "sglang-dflash-check"}
    return names


def test_the_standin_has_every_attribute_the_flake_touches():
    lib = require_dep("nixpkgs-lib")
    standin = nix_eval(
        f"builtins.attrNames (import {nix_literal(REPO / 'tests/nix/nixpkgs-standin')} "
        f"{{ lib = import {nix_literal(lib / 'lib')}; }})")
    used = used_attrs()
    assert {"callPackage", "callPackages", "runCommand", "symlinkJoin", "makeWrapper",
            "testers", "nixfmt-tree"} <= used  # the scan sees what flake.nix and pkgs/ use
    assert sorted(used - set(standin)) == []


def test_the_standin_names_the_nixpkgs_file_of_each_attribute():
    text = (REPO / "tests/nix/nixpkgs-standin/pkgs.nix").read_text()
    assert "567a49d1913ce81ac6e9582e3553dd90a955875f" in \
        (REPO / "tests/nix/nixpkgs-standin/default.nix").read_text()
    for name in ("python312", "cudaPackages_13_0", "autoPatchelfHook", "autoAddDriverRunpath",
                 "symlinkJoin", "makeWrapper", "runCommand", "fetchurl", "mkShell"):
        block = text.split(f"  {name} =", 1)
        assert len(block) == 2, name
        assert re.search(r"# (pkgs|nixos)/[\w./-]+\s*(\S.*)?\n\s*$", block[0][-400:]), name


def _paths(f: Path) -> list[Path]:
    code = "\n".join(line.split("#", 1)[0] for line in f.read_text().splitlines())
    return [(f.parent / p).resolve() for p in PATH_LIT.findall(code)]


def test_nothing_under_pkgs_imports_from_overlays():
    bad = [(f.relative_to(REPO), p.relative_to(REPO)) for f in (REPO / "pkgs").rglob("*.nix")
           for p in _paths(f) if p.is_relative_to(REPO / "overlays")]
    assert bad == []


def test_nix_dir_holds_pure_helpers():
    for f in (REPO / "nix").glob("*.nix"):
        for p in _paths(f):
            assert not p.is_relative_to(REPO / "pkgs") and not p.is_relative_to(
                REPO / "overlays"), (f, p)
        args = nix_eval(f"builtins.attrNames (builtins.functionArgs (import {nix_literal(f)}))")
        assert not {"pkgs", "stdenv", "callPackage"} & set(args), (f, args)


def test_the_path_scan_sees_a_violation(tmp_path):
    """The scan is not vacuous: a pkgs/ file importing ../overlays/x.nix is found."""
    f = tmp_path / "pkgs" / "a.nix"
    f.parent.mkdir()
    f.write_text("{ }: import ../overlays/python.nix  # ../overlays/in-a-comment.nix\n")
    assert _paths(f) == [(tmp_path / "overlays/python.nix").resolve()]
