"""The module-eval flake check (pkgs/checks/module-eval.nix), run at lib level against the
real modules/sglang-dflash.nix with the two-instance example (tests/nix/module-example.nix).

nixosSystem is replaced by lib.evalModules plus the few NixOS options the module sets
(tests/nix/stub-nixos.nix); on a Nix >= 2.18 host `nix flake check` runs the same file
with the real nixosSystem. Needs SGLANG_DFLASH_NIXPKGS_LIB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.nix.nixtools import REPO, EvalError, nix_eval, nix_literal, require_dep

MODULE = REPO / "modules" / "sglang-dflash.nix"


def run_check(example: Path) -> dict:
    lib = require_dep("nixpkgs-lib")
    if not MODULE.exists():
        pytest.skip("modules/sglang-dflash.nix is not written yet")
    return nix_eval(f"""
      let
        stub = import {nix_literal(REPO / "tests/nix/stub-nixos.nix")} {{
          nixpkgsLib = {nix_literal(lib)};
        }};
        drv = import {nix_literal(REPO / "pkgs/checks/module-eval.nix")} {{
          inherit (stub) lib nixosSystem writeText;
          pkgs = stub.stubPkgs // {{ stdenv.hostPlatform.system = "x86_64-linux"; }};
          nixosModule = {nix_literal(MODULE)};
          example = {nix_literal(example)};
        }};
      in builtins.fromJSON drv.text
    """)


def test_module_eval_check_passes_on_the_example():
    rendered = run_check(REPO / "tests" / "nix" / "module-example.nix")
    assert sorted(rendered) == ["small", "tree"]
    tree = json.loads(rendered["tree"])
    assert tree["ExecStart"].endswith(".json")
    assert " serve --config " in tree["ExecStart"]
    config = tree["ExecStart"].split(" serve --config ")[1]
    assert tree["ExecStartPre"].endswith(f"/bin/sglang-dflash check --offline --config {config}")
    assert json.loads(rendered["small"])["ExecStartPre"] is None


def test_module_eval_check_fails_on_a_wrong_example(tmp_path: Path):
    """Same GPU in both instances: the module's assertion fires and the check says so."""
    text = (REPO / "tests" / "nix" / "module-example.nix").read_text()
    bad = tmp_path / "example.nix"
    bad.write_text(text.replace("gpus = [ 1 ];", "gpus = [ 0 ];"))
    with pytest.raises(EvalError, match="module-eval: the example must pass every assertion"):
        run_check(bad)
