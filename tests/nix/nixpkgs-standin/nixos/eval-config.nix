# lib.nixosSystem (nixos/lib/eval-config.nix): lib.evalModules over the configuration's
# modules and the stand-in NixOS options; `pkgs` = nixpkgs.pkgs (read-only) when given.
{
  lib,
  modules,
  pkgs ? null,
  specialArgs ? { },
  ...
}:
lib.evalModules {
  inherit specialArgs;
  modules =
    modules
    ++ [ ./options.nix ]
    ++ (
      if pkgs == null then
        [ ./nixpkgs.nix ]
      else
        [
          ./read-only.nix
          { nixpkgs.pkgs = pkgs; }
        ]
    );
}
