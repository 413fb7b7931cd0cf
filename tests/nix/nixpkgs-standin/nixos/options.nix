# The NixOS options modules/sglang-dflash.nix (and the flake's checks) set, declared with
# the types nixpkgs 567a49d gives them. Mirrors, in part:
#   nixos/modules/misc/assertions.nix           assertions, warnings
#   nixos/lib/systemd-unit-options.nix          systemd.services.<name> (serviceOptions)
#   nixos/modules/config/users-groups.nix       users.users, users.groups
#   nixos/modules/services/networking/firewall.nix  networking.firewall.allowedTCPPorts
#   nixos/modules/config/system-path.nix        environment.systemPackages
#   nixos/modules/system/activation/top-level.nix   system.build.toplevel (throws the failed
#                                                   assertions, as NixOS does)
{ config, lib, pkgs, ... }:
let
  inherit (lib) mkOption types;
  # nixos/lib/systemd-lib.nix unitOption: a value systemd can take (or a list of them)
  atom = types.oneOf [ types.bool types.int types.str types.path types.package ];
  unitOption = types.either atom (types.listOf atom);
  serviceModule = {
    options = {
      enable = mkOption { type = types.bool; default = true; };
      description = mkOption { type = types.singleLineStr; default = ""; };
      after = mkOption { type = types.listOf types.str; default = [ ]; };
      before = mkOption { type = types.listOf types.str; default = [ ]; };
      wants = mkOption { type = types.listOf types.str; default = [ ]; };
      requires = mkOption { type = types.listOf types.str; default = [ ]; };
      wantedBy = mkOption { type = types.listOf types.str; default = [ ]; };
      environment = mkOption {
        type = types.attrsOf (types.nullOr (types.oneOf [ types.str types.path types.package ]));
        default = { };
      };
      path = mkOption { type = types.listOf (types.either types.package types.str); default = [ ]; };
      unitConfig = mkOption { type = types.attrsOf unitOption; default = { }; };
      serviceConfig = mkOption { type = types.attrsOf unitOption; default = { }; };
      script = mkOption { type = types.lines; default = ""; };
    };
  };
  failed = map (a: a.message) (lib.filter (a: !a.assertion) config.assertions);
in
{
  options = {
    assertions = mkOption {
      type = types.listOf types.unspecified;
      internal = true;
      default = [ ];
    };
    warnings = mkOption {
      type = types.listOf types.str;
      internal = true;
      default = [ ];
    };
    systemd.services = mkOption {
      type = types.attrsOf (types.submodule serviceModule);
      default = { };
    };
    users.users = mkOption {
      type = types.attrsOf (types.submodule {
        options = {
          isSystemUser = mkOption { type = types.bool; default = false; };
          isNormalUser = mkOption { type = types.bool; default = false; };
          group = mkOption { type = types.str; default = ""; };
          extraGroups = mkOption { type = types.listOf types.str; default = [ ]; };
          home = mkOption { type = types.path; default = "/var/empty"; };
          description = mkOption { type = types.str; default = ""; };
        };
      });
      default = { };
    };
    users.groups = mkOption {
      type = types.attrsOf (types.submodule {
        options = {
          gid = mkOption { type = types.nullOr types.int; default = null; };
          members = mkOption { type = types.listOf types.str; default = [ ]; };
        };
      });
      default = { };
    };
    networking.firewall.allowedTCPPorts = mkOption {
      type = types.listOf types.port;
      default = [ ];
    };
    networking.firewall.allowedUDPPorts = mkOption {
      type = types.listOf types.port;
      default = [ ];
    };
    environment.systemPackages = mkOption {
      type = types.listOf types.package;
      default = [ ];
    };
    boot.isContainer = mkOption { type = types.bool; default = false; };
    system.stateVersion = mkOption { type = types.str; default = lib.trivial.release; };
    system.build.toplevel = mkOption { type = types.package; readOnly = true; };
  };
  config.system.build.toplevel =
    if failed != [ ] then
      throw "\nFailed assertions:\n${lib.concatStringsSep "\n" (map (x: "- ${x}") failed)}"
    else
      pkgs.runCommand "nixos-system-standin" {
        units = lib.attrNames config.systemd.services;
        packages = config.environment.systemPackages;
      } "mkdir $out";
}
