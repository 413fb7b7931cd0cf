# A package-set stand-in for nixpkgs (NixOS/nixpkgs 567a49d1913ce81ac6e9582e3553dd90a955875f,
# the flake.lock revision), used with the REAL nixpkgs `lib` (placed at ./lib by
# tests/nix/realnix/run.sh, or passed as `lib`). Only the attributes this flake (and the
# uv2nix / pyproject.nix / build-system-pkgs code it calls) touches exist; each names the
# nixpkgs file it mirrors. Those files were read in the public code index, which holds
# nixpkgs files at various revisions but not at 567a49d (its lib is the real one, pinned in
# tests/nix/nixpkgs-lib.lock.json); what a revision could change is the stand-in's risk. Derivations are real `derivation`s (drvPath, dry-run), never
# buildable: their builder fails. The call machinery (callPackage, callPackages, newScope,
# makeScope, makeOverridable) is nixpkgs' own lib.
{
  system ? "x86_64-linux",
  config ? { },
  overlays ? [ ],
  lib ? import ./lib,
  ...
}:
let
  base = import ./pkgs.nix { inherit lib system config overlays; };
in
lib.fix (lib.extends (lib.composeManyExtensions overlays) base)
