# `sglang-dflash-check`: the full check (package, ABI, GPU layers; `--url` adds live)
# against the built package. Runs outside the sandbox (`nix run .#check`), where the
# driver and GPUs are visible.
{ writeShellApplication, sglang-dflash }:
writeShellApplication {
  name = "sglang-dflash-check";
  runtimeInputs = [ sglang-dflash ];
  text = ''
    exec sglang-dflash check "$@"
  '';
}
