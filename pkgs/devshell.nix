# `nix develop`: the pinned environment with src/ editable (uv2nix editable overlay),
# the dev group (pytest, hypothesis, ruff), uv and nixfmt, the run-time JIT environment,
# and the pins printed on entry.
{
  lib,
  mkShell,
  uv,
  nixfmt,
  sglang-dflash,
}:
let
  inherit (sglang-dflash)
    pins
    pythonSet
    workspace
    runtimeEnv
    ;
  editable = workspace.mkEditablePyprojectOverlay { root = "$REPO_ROOT"; };
  devSet = pythonSet.overrideScope (
    lib.composeManyExtensions [
      editable
      # hatchling builds editables through the `editables` package.
      (final: prev: {
        sglang-dflash = prev.sglang-dflash.overrideAttrs (old: {
          nativeBuildInputs = (old.nativeBuildInputs or [ ]) ++ final.resolveBuildSystem { editables = [ ]; };
        });
      })
    ]
  );
  venv = devSet.mkVirtualEnv "sglang-dflash-dev-env" workspace.deps.all;
  pinLine = lib.concatStringsSep ", " (
    lib.mapAttrsToList (n: v: "${n} ${v}") pins.distributions
    ++ [
      "CUDA ${pins.cuda.version}"
      "Python ${pins.python.package}"
    ]
  );
in
mkShell {
  packages = [
    venv
    uv
    nixfmt
  ];
  env = runtimeEnv.variables // {
    UV_NO_SYNC = "1";
    UV_PYTHON = "${venv}/bin/python";
    UV_PYTHON_DOWNLOADS = "never";
  };
  shellHook = ''
    unset PYTHONPATH
    export REPO_ROOT="$(git rev-parse --show-toplevel)"
    export LD_LIBRARY_PATH="${lib.concatStringsSep ":" runtimeEnv.libraryPath}''${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PATH="${lib.concatStringsSep ":" runtimeEnv.path}:$PATH"
    echo "sglang-dflash dev shell; pins (src/sglang_dflash/pins.toml): ${pinLine}"
  '';
}
