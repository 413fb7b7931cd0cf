# A lib-only stand-in for nixpkgs.lib.nixosSystem (Nix 2.8 cannot evaluate nixpkgs):
# lib.evalModules with just the NixOS options modules/sglang-dflash.nix touches, so the
# module-eval check (pkgs/checks/module-eval.nix) runs here against the real module.
{ nixpkgsLib }:
let
  lib = import (nixpkgsLib + "/lib");
  inherit (lib) mkOption types;
  anything = mkOption {
    type = types.anything;
    default = null;
  };
  stubPkgs = {
    sglang-dflash = {
      outPath = "/nix/store/00000000000000000000000000000000-sglang-dflash";
      name = "sglang-dflash";
    };
    writeText = name: _text: "/nix/store/00000000000000000000000000000000-${name}";
    runCommand = name: _env: _script: "/nix/store/00000000000000000000000000000000-${name}";
  };
  nixosOptions = {
    options = {
      assertions = mkOption {
        type = types.listOf types.unspecified;
        default = [ ];
      };
      warnings = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      systemd.services = mkOption {
        type = types.attrsOf (types.attrsOf types.anything);
        default = { };
      };
      networking.firewall.allowedTCPPorts = mkOption {
        type = types.listOf types.port;
        default = [ ];
      };
      users.users = mkOption {
        type = types.attrsOf types.anything;
        default = { };
      };
      users.groups = mkOption {
        type = types.attrsOf types.anything;
        default = { };
      };
      nixpkgs.hostPlatform = anything;
      nixpkgs.config = anything;
      nixpkgs.overlays = anything;
      boot.isContainer = anything;
      system.stateVersion = anything;
    };
    config._module.args.pkgs = stubPkgs;
  };
in
{
  inherit lib stubPkgs;
  nixosSystem =
    { modules }:
    lib.evalModules {
      modules = modules ++ [ nixosOptions ];
    };
  writeText = name: text: {
    inherit name text;
  };
}
