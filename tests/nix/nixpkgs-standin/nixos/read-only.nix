# nixpkgs.* when pkgs is given (nixos/modules/misc/nixpkgs/read-only.nix, which
# testers.runNixOSTest's nodes get through node.pkgsReadOnly = true): config and overlays
# are types.unique with the message "nixpkgs.<x> is set to read-only", so any module that
# sets them fails to evaluate.
{ config, lib, ... }:
let
  inherit (lib) mkOption types;
in
{
  options.nixpkgs = {
    pkgs = mkOption { type = types.pkgs; };
    config = mkOption {
      internal = true;
      type = types.unique { message = "nixpkgs.config is set to read-only"; } types.anything;
    };
    overlays = mkOption {
      internal = true;
      type = types.unique { message = "nixpkgs.overlays is set to read-only"; } types.anything;
    };
    hostPlatform = mkOption { internal = true; readOnly = true; };
  };
  config = {
    _module.args.pkgs = builtins.seq config.nixpkgs.config (
      builtins.seq config.nixpkgs.overlays config.nixpkgs.pkgs
    );
    nixpkgs.config = config.nixpkgs.pkgs.config;
    nixpkgs.overlays = config.nixpkgs.pkgs.overlays;
    nixpkgs.hostPlatform = config.nixpkgs.pkgs.stdenv.hostPlatform;
  };
}
