# `nix run .#check` (the full check, GPU layer included, outside the sandbox) and
# `nix run .#serve -- --config FILE` (one server from an instance config).
{
  lib,
  writeShellApplication,
  sglang-dflash,
  sglang-dflash-check,
}:
let
  serve = writeShellApplication {
    name = "sglang-dflash-serve";
    runtimeInputs = [ sglang-dflash ];
    text = ''
      exec sglang-dflash serve "$@"
    '';
  };
in
{
  check = {
    type = "app";
    program = lib.getExe sglang-dflash-check;
    meta.description = "sglang-dflash check: package, ABI, GPU (and --url live) layers";
  };
  serve = {
    type = "app";
    program = lib.getExe serve;
    meta.description = "sglang-dflash serve --config FILE: one DFlash/DDTree server";
  };
}
