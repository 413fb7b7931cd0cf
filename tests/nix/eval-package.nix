# Lib-level evaluation of the flake's package wiring: overlays/default.nix applied to a
# stub nixpkgs whose pyproject.nix `build.packages` scope is the stub Python set of
# ./stubs.nix, with the real uv2nix workspace of workspaceRoot. Renders what the package,
# the check app, the apps, the dev shell and the checks would run.
# Used by tests/nix/test_package_eval.py.
{
  nixpkgsLib,
  uv2nixSrc,
  pyprojectNixSrc,
  workspaceRoot,
  pythonVersion,
}:
let
  lib = import (nixpkgsLib + "/lib");
  pins = import ../../nix/pins.nix { pinsFile = workspaceRoot + "/src/sglang_dflash/pins.toml"; };
  stubs = import ./stubs.nix { inherit lib pins pythonVersion; };
  realPyprojectNix = import pyprojectNixSrc { inherit lib; };
  uv2nix.lib = import (uv2nixSrc + "/lib") {
    inherit lib;
    pyproject-nix = realPyprojectNix;
  };

  # pyproject.nix's package scope, reduced to what our files use.
  mkScope =
    overlay:
    let
      set = lib.fix (lib.extends overlay (_: stubs.base // { resolveBuildSystem = _: [ ]; }));
    in
    set
    // {
      overrideScope = more: mkScope (lib.composeExtensions overlay more);
      mkVirtualEnv = name: spec: {
        inherit name spec;
        outPath = "/stub/${name}";
      };
    };
  pyproject-nix = realPyprojectNix // {
    build = realPyprojectNix.build // {
      packages = { python }: mkScope (_: _: { });
    };
  };
  pyproject-build-systems.overlays.wheel = _: _: { };

  overlay = import ../../overlays {
    inherit
      uv2nix
      pyproject-nix
      pyproject-build-systems
      workspaceRoot
      ;
  };

  pkgs = lib.fix (
    self:
    stubs.stubPkgs
    // {
      inherit lib;
      pkgs = self;
      ${pins.pythonAttr} = stubs.python;
      ${pins.cudaPackagesAttr} = {
        cudaMajorMinorVersion = pins.cuda.version;
        cudatoolkit = "/stub/cuda-merged";
        backendStdenv.cc = "/stub/gcc-wrapper";
      };
      callPackage =
        f: args:
        let
          fn = if builtins.isFunction f then f else import f;
        in
        fn (builtins.intersectAttrs (builtins.functionArgs fn) (self // args));
      symlinkJoin = a: a // a.passthru // { outPath = "/stub/${a.name}"; };
      makeWrapper = "/stub/make-wrapper";
      addDriverRunpath.driverLink = "/run/opengl-driver";
      ninja = "/stub/ninja";
      uv = "/stub/uv";
      nixfmt = "/stub/nixfmt";
      writeShellApplication =
        a:
        a
        // {
          type = "derivation";
          outPath = "/stub/${a.name}";
          meta.mainProgram = a.name;
        };
      mkShell = a: a;
      runCommand = name: env: script: { inherit name env script; };
    }
    // overlay self { }
  );

  pkg = pkgs.sglang-dflash;
  devShell = pkgs.callPackage ../../pkgs/devshell.nix { };
  checks = pkgs.callPackage ../../pkgs/checks {
    src = "/stub/source";
    nixosSystem = throw "not evaluated here";
    nixosModule = { };
  };
in
{
  package = {
    inherit (pkg)
      name
      postBuild
      sglangVersion
      ;
    mainProgram = pkg.meta.mainProgram;
    pins = pkg.pins.distributions;
    venvSpec = pkg.venv.spec;
    patches = map (p: p.name) pkg.patches;
  };
  checkApp = pkgs.sglang-dflash-check.text;
  apps = lib.mapAttrs (_: a: a.program) (pkgs.callPackage ../../pkgs/apps.nix { });
  devShell = {
    inherit (devShell) shellHook env;
    packages = map toString devShell.packages;
  };
  checks = {
    preflight = checks.preflight.script;
    pytest = checks.pytest.script;
    format = checks.format.script;
  };
}
