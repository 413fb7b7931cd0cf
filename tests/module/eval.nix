# Lib-only evaluation of modules/sglang-dflash.nix: no nixpkgs package set, no NixOS.
# The options the module writes to (systemd, networking, users, assertions) are stubbed,
# `pkgs` holds only what the module uses. Prints the rendered units, the instance configs,
# and the messages of failed assertions.
#   nix-instantiate --eval --strict --json tests/module/eval.nix \
#     --arg lib 'import /path/to/nixpkgs-lib/lib' --arg configuration '{ ... }'
{ lib, configuration, pkgsExtra ? { } }:
let
  inherit (lib) mkOption types;
  stubs = {
    options = {
      assertions = mkOption { type = types.listOf types.unspecified; default = [ ]; };
      warnings = mkOption { type = types.listOf types.str; default = [ ]; };
      systemd.services = mkOption { type = types.attrsOf types.anything; default = { }; };
      networking.firewall.allowedTCPPorts = mkOption { type = types.listOf types.port; default = [ ]; };
      users.users = mkOption { type = types.attrsOf types.anything; default = { }; };
      users.groups = mkOption { type = types.attrsOf types.anything; default = { }; };
    };
  };
  pkgs = {
    sglang-dflash = {
      type = "derivation";
      name = "sglang-dflash-0.1.0";
      outPath = "${builtins.storeDir}/00000000000000000000000000000000-sglang-dflash-0.1.0";
    };
    writeText = name: _text: "${builtins.storeDir}/11111111111111111111111111111111-${name}";
    runCommand = name: _env: _script: "${builtins.storeDir}/11111111111111111111111111111111-${name}";
  };
  evaluated = lib.evalModules {
    modules = [ stubs ../../modules/sglang-dflash.nix configuration { _module.args.pkgs = pkgs // pkgsExtra; } ];
  };
  cfg = evaluated.config;
in
{
  services = cfg.systemd.services;
  firewall = cfg.networking.firewall.allowedTCPPorts;
  users = cfg.users.users;
  groups = cfg.users.groups;
  configs = lib.mapAttrs (_: i: i.finalConfig) cfg.services.sglang-dflash.instances;
  failedAssertions = map (a: a.message) (lib.filter (a: !a.assertion) cfg.assertions);
}
