# The nixpkgs overlay: adds `sglang-dflash` (the pinned SGLang + DFlash/DDTree overlay +
# CLI) and `sglang-dflash-check` (the full check, GPU layer included, for `nix run`).
# Takes the flake inputs that are not nixpkgs; everything else comes from `final`.
{
  uv2nix,
  pyproject-nix,
  pyproject-build-systems,
  workspaceRoot,
}:
final: _prev:
let
  pins = import ../nix/pins.nix { pinsFile = workspaceRoot + "/src/sglang_dflash/pins.toml"; };
  patches = import ../nix/patches.nix {
    patchesRoot = workspaceRoot + "/overlays/patches";
    dirName = pins.patchDirName;
  };
in
{
  sglang-dflash = final.callPackage ../pkgs/sglang-dflash {
    inherit
      uv2nix
      pyproject-nix
      pyproject-build-systems
      workspaceRoot
      pins
      patches
      ;
    # The Python-set overlay stack lives here (overlays/); pkgs/ never imports overlays/.
    mkPythonOverlay = import ./python.nix;
  };
  sglang-dflash-check = final.callPackage ../pkgs/sglang-dflash-check.nix { };
}
