# Lib-level evaluation of services.sglang-dflash with routers (modules/router.nix via its one
# import line), as tests/module/eval.nix does for instances. runCommand/writeText stand-ins
# return the text they were given after a marker, so the test reads the router config JSON
# (and the instance configs it points to) out of the rendered ExecStart.
{ lib, configuration }:
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
    writeText = name: text: "INSTANCE<${text}>";
    runCommand = name: env: _script: if lib.hasPrefix "sglang-dflash-router-" name
      then "ROUTER<${env.config}>" else "${builtins.storeDir}/11111111111111111111111111111111-${name}";
  };
  evaluated = lib.evalModules {
    modules = [ stubs ../../modules/sglang-dflash.nix configuration { _module.args.pkgs = pkgs; } ];
  };
  cfg = evaluated.config;
in
{
  services = cfg.systemd.services;
  firewall = cfg.networking.firewall.allowedTCPPorts;
  configs = lib.mapAttrs (_: i: i.finalConfig) cfg.services.sglang-dflash.instances;
  failedAssertions = map (a: a.message) (lib.filter (a: !a.assertion) cfg.assertions);
}
