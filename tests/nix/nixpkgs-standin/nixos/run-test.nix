# testers.runNixOSTest (pkgs/build-support/testers/default.nix -> nixos/lib/testing):
# every node is a NixOS configuration with read-only pkgs (nixos/lib/testing/nodes.nix,
# node.pkgsReadOnly defaults to true); the result is a derivation that depends on each
# node's system, so evaluating its drvPath evaluates every node. The VM is not run.
{ lib, pkgs }:
test:
let
  t = if lib.isFunction test then test { inherit pkgs lib; } else test;
  readOnly = t.node.pkgsReadOnly or true;
  evalNode =
    name: module:
    (import ./eval-config.nix {
      inherit lib;
      modules = [ module ] ++ lib.optional (!readOnly) { nixpkgs.hostPlatform = pkgs.system; };
      pkgs = if readOnly then pkgs else null;
    }).config;
  nodes = lib.mapAttrs evalNode t.nodes;
in
pkgs.runCommand "vm-test-run-${t.name}" {
  inherit (t) testScript;
  nodes = lib.mapAttrsToList (_: c: c.system.build.toplevel) nodes;
  passthru = { inherit nodes; };
} "exit 1"
