# nixpkgs.* for a configuration that builds its own pkgs (nixos/modules/misc/nixpkgs.nix):
# hostPlatform, config, overlays (a list: several modules may add overlays).
{ config, lib, ... }:
let
  inherit (lib) mkOption types;
  overlayType = lib.mkOptionType {
    name = "nixpkgs-overlay";
    check = lib.isFunction;
    merge = lib.mergeOneOption;
  };
in
{
  options.nixpkgs = {
    hostPlatform = mkOption { type = types.either types.str types.attrs; };
    config = mkOption { type = types.attrs; default = { }; };
    overlays = mkOption { type = types.listOf overlayType; default = [ ]; };
  };
  config._module.args.pkgs = import ../default.nix {
    inherit lib;
    system = config.nixpkgs.hostPlatform.system or config.nixpkgs.hostPlatform;
    inherit (config.nixpkgs) config overlays;
  };
}
