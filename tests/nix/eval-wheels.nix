# Lib-only evaluation (works with Nix 2.8, no nixpkgs package set) of what the build
# would fetch: loads the uv2nix workspace from our uv.lock, applies the same overlay
# stack as overlays/python.nix minus pyproject-build-systems (which needs real pkgs)
# to a stub package set, and reports every package's source and fixups.
# Used by tests/nix/test_uv2nix_eval.py; the stubs stand in for nixpkgs only.
{
  nixpkgsLib,
  uv2nixSrc,
  pyprojectNixSrc,
  workspaceRoot,
  pythonVersion, # e.g. "3.12.11": must match pins.python.package
  glibcVersion ? "2.40",
}:
let
  lib = import (nixpkgsLib + "/lib");
  pyproject-nix = import pyprojectNixSrc { inherit lib; };
  uv2nix = {
    lib = import (uv2nixSrc + "/lib") { inherit lib pyproject-nix; };
  };
  pins = import ../../nix/pins.nix { pinsFile = workspaceRoot + "/src/sglang_dflash/pins.toml"; };
  patches = import ../../nix/patches.nix {
    patchesRoot = workspaceRoot + "/overlays/patches";
    dirName = pins.patchDirName;
  };

  stubs = import ./stubs.nix { inherit lib pins pythonVersion glibcVersion; };
  inherit (stubs) stubPkgs base;

  workspace = uv2nix.lib.workspace.loadWorkspace { inherit workspaceRoot; };
  overlay = lib.composeManyExtensions [
    (workspace.mkPyprojectOverlay { sourcePreference = "wheel"; })
    (import ../../pkgs/sglang-dflash/fixups.nix {
      inherit lib;
      pkgs = stubPkgs;
    })
    (import ../../overlays/ddtree.nix { inherit lib pins patches; })
  ];
  set = lib.fix (lib.extends overlay (_: base));
  packageNames = builtins.filter (n: !(builtins.hasAttr n base)) (builtins.attrNames set);
  describe =
    name:
    let
      p = set.${name};
      local = !(p.passthru ? package); # uv2nix builds workspace members with build.local
    in
    {
      inherit name local;
      version = p.version;
      format = p.passthru.format or "pyproject";
      url = if local then null else p.src.url;
      hash = if local then null else p.src.hash;
      fixup = p.sglangDflashFixup or null;
      ignoreMissing = p.autoPatchelfIgnoreMissingDeps or [ ];
      # The autoPatchelf search-path hook names its deps' store paths (/stub/<name> here).
      preFixup = p.preFixup or "";
      postInstall = p.postInstall or "";
    };
in
{
  packages = map describe packageNames;
  ddtreePatches = set.sglang.ddtreePatches;
  venvSpec = workspace.deps.all;
}
