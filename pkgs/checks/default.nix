# `nix flake check` checks. All run in the sandbox without a GPU; the GPU layer is
# `nix run .#check` (apps), outside the sandbox.
{
  lib,
  pkgs,
  runCommand,
  src,
  sglang-dflash,
  nixosSystem,
  nixosModule,
}:
let
  inherit (sglang-dflash) pythonSet workspace;
  # The project with every extra and group (gpu, bench, dev: pytest, hypothesis, ruff).
  testEnv = pythonSet.mkVirtualEnv "sglang-dflash-test-env" workspace.deps.all;
in
{
  # The package's own verification, against the built package: package and ABI layers
  # (GPU and live layers report SKIP with the reason in --offline mode).
  preflight = runCommand "sglang-dflash-preflight" { nativeBuildInputs = [ sglang-dflash ]; } ''
    export HOME="$(mktemp -d)"
    set -o pipefail
    sglang-dflash check --offline 2>&1 | tee "$out"
  '';

  # The Python test suite against the built environment (not the source tree's copy).
  pytest = runCommand "sglang-dflash-pytest" { nativeBuildInputs = [ testEnv ]; } ''
    export HOME="$(mktemp -d)"
    cp -r ${src} source && chmod -R u+w source && cd source
    # sglang_dflash is imported from the environment, not from ./src.
    set -o pipefail
    python -m pytest -q -p no:cacheprovider tests 2>&1 | tee "$out"
  '';

  module-eval = pkgs.callPackage ./module-eval.nix { inherit nixosSystem nixosModule; };

  # A NixOS VM running the module's unit with the SGLang stand-in (needs KVM; not yet run).
  vm-standin = pkgs.callPackage ./vm-standin.nix { inherit src nixosModule; };

  format = runCommand "sglang-dflash-format" { nativeBuildInputs = [ pkgs.nixfmt ]; } ''
    cd ${src}
    find . -name '*.nix' -not -path './.git/*' -print0 | sort -z | xargs -0 nixfmt --check
    touch "$out"
  '';
}
