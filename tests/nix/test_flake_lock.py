"""flake.lock: consistent with flake.nix, complete, and (given checkouts) its narHashes
are the hashes of the locked trees, recomputed here with nix-hash."""

from __future__ import annotations

import json
import re

import pytest

from tests.nix.nixtools import REPO, nar_hash_sri, nix_eval, nix_literal, require_dep

LOCK = json.loads((REPO / "flake.lock").read_text())
NODES = LOCK["nodes"]
SRI = re.compile(r"^sha256-[A-Za-z0-9+/]{43}=$")


def test_lock_format():
    assert LOCK["version"] == 7 and LOCK["root"] == "root"
    assert set(NODES["root"]["inputs"]) == {
        "nixpkgs", "pyproject-nix", "uv2nix", "pyproject-build-systems"}


@pytest.mark.parametrize("name", ["nixpkgs", "pyproject-nix", "uv2nix", "pyproject-build-systems"])
def test_locked_node_is_complete(name):
    locked = NODES[NODES["root"]["inputs"][name]]["locked"]
    assert locked["type"] == "github"
    assert re.fullmatch(r"[0-9a-f]{40}", locked["rev"])
    assert SRI.match(locked["narHash"])
    assert locked["lastModified"] > 1_700_000_000


def test_lock_follows_match_flake_nix():
    flake_inputs = nix_eval(
        f"builtins.mapAttrs (_: i: {{ url = i.url; follows = builtins.mapAttrs (_: v: v.follows)"
        f" (i.inputs or {{ }}); }}) (import {nix_literal(REPO / 'flake.nix')}).inputs")
    for name, spec in flake_inputs.items():
        node = NODES[NODES["root"]["inputs"][name]]
        assert {k: v[0] for k, v in node.get("inputs", {}).items()} == spec["follows"], name
        original = node["original"]
        url = f"github:{original['owner']}/{original['repo']}"
        if "ref" in original:
            url += f"/{original['ref']}"
        assert url == spec["url"], name


def test_nixpkgs_is_a_nixos_unstable_revision():
    assert NODES["nixpkgs"]["original"]["ref"] == "nixos-unstable"


@pytest.mark.slow
@pytest.mark.parametrize("node,dep", [("uv2nix", "uv2nix"), ("pyproject-nix", "pyproject-nix")])
def test_narhash_matches_checkout(node, dep):
    """The checkout must be `git archive` of the locked rev (docs/nix.md)."""
    path = require_dep(dep)
    assert nar_hash_sri(path) == NODES[node]["locked"]["narHash"], (
        f"{path} is not an export of {NODES[node]['locked']['rev']}")


LIB_PIN = json.loads((REPO / "tests/nix/nixpkgs-lib.lock.json").read_text())


def test_nixpkgs_lib_pin_names_flake_locks_nixpkgs():
    """The lib tree the harness evaluates is pinned against the nixpkgs flake.lock locks: a
    re-lock of nixpkgs that leaves tests/nix/nixpkgs-lib.lock.json behind fails here."""
    locked = NODES["nixpkgs"]["locked"]
    assert LIB_PIN["nixpkgs"] == {k: locked[k] for k in ("rev", "narHash", "lastModified")}
    # the exported tree predates the locked nixpkgs (a weekly sync of master, then the rev)
    assert LIB_PIN["tree"]["upstreamLibCommitTime"] <= LIB_PIN["tree"]["lastModified"] \
        <= LIB_PIN["nixpkgs"]["lastModified"]


@pytest.mark.slow
def test_nixpkgs_lib_checkout_is_the_pinned_tree():
    """SGLANG_DFLASH_NIXPKGS_LIB must be `git archive` of the pinned nixpkgs.lib rev."""
    path = require_dep("nixpkgs-lib")
    assert nar_hash_sri(path) == LIB_PIN["tree"]["narHash"], (
        f"{path} is not an export of nixpkgs.lib {LIB_PIN['tree']['rev']}")
    assert nar_hash_sri(path / "lib") == LIB_PIN["tree"]["libNarHash"]
