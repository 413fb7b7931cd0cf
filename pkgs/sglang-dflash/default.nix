# sglang-dflash: the uv2nix virtual environment of uv.lock (sglang-dflash[gpu]: pinned
# SGLang, torch/CUDA 13 wheels, the DDTree plugin and patches), with `sglang-dflash`
# wrapped in the run-time JIT environment. The pins are exposed, read from pins.toml.
{
  lib,
  pkgs,
  callPackage,
  symlinkJoin,
  makeWrapper,
  uv2nix,
  pyproject-nix,
  pyproject-build-systems,
  workspaceRoot,
  pins,
  # The patch series (overlays/patches/sglang-<pin>/), listed by overlays/default.nix.
  patches,
  # overlays/python.nix, passed in by overlays/default.nix (the import direction is
  # flake.nix -> overlays/ -> pkgs/).
  mkPythonOverlay,
}:
let
  python = pkgs.${pins.pythonAttr};
  cudaPackages = pkgs.${pins.cudaPackagesAttr};

  workspace = uv2nix.lib.workspace.loadWorkspace { inherit workspaceRoot; };
  pythonOverlay = mkPythonOverlay {
    inherit
      lib
      pkgs
      workspace
      pyproject-build-systems
      pins
      patches
      ;
  };

  pythonSet = (callPackage pyproject-nix.build.packages { inherit python; }).overrideScope pythonOverlay;

  # The runtime closure: the project with its `gpu` extra and its `router` extra (smg, SGLang's
  # router, which `sglang-dflash router` runs; see pyproject.toml and docs/router.md).
  venv = pythonSet.mkVirtualEnv "sglang-dflash-env" { sglang-dflash = [ "gpu" "router" ]; };

  runtimeEnv = callPackage ./runtime-env.nix { inherit pins cudaPackages; };

  wrapperArgs = lib.concatStringsSep " " (
    lib.mapAttrsToList (n: v: "--set-default ${n} ${lib.escapeShellArg v}") runtimeEnv.variables
    ++ [
      "--prefix LD_LIBRARY_PATH : ${lib.escapeShellArg (lib.concatStringsSep ":" runtimeEnv.libraryPath)}"
      "--prefix PATH : ${lib.escapeShellArg (lib.concatStringsSep ":" runtimeEnv.path)}"
    ]
  );
in
assert lib.assertMsg (
  pythonSet.sglang.version == pins.distributions.sglang
) "sglang-dflash: uv.lock has sglang ${pythonSet.sglang.version}, pins.toml says ${pins.distributions.sglang}; run `uv lock`";
symlinkJoin {
  name = "sglang-dflash-${pythonSet.sglang-dflash.version}";
  paths = [ venv ];
  nativeBuildInputs = [ makeWrapper ];
  postBuild = ''
    rm "$out/bin/sglang-dflash"
    makeWrapper "${venv}/bin/sglang-dflash" "$out/bin/sglang-dflash" ${wrapperArgs}
  '';
  passthru = {
    inherit
      pins
      pythonSet
      venv
      workspace
      runtimeEnv
      cudaPackages
      patches
      ;
    # Version facts for the module and the checks, never restated in Nix.
    sglangVersion = pythonSet.sglang.version;
  };
  meta = {
    description = "SGLang ${pins.distributions.sglang} with DFlash/DDTree speculative decoding, pinned and self-checking";
    mainProgram = "sglang-dflash";
    license = lib.licenses.asl20;
    platforms = [ "x86_64-linux" ];
  };
}
