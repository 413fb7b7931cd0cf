# The stand-in as a flake input (`--override-input nixpkgs path:<assembled tree>`), in the
# shape of nixpkgs' own flake.nix: lib (the real one, at ./lib, extended with nixosSystem),
# legacyPackages, and `import nixpkgs { ... }` through ./default.nix.
{
  outputs =
    { self }:
    let
      baseLib = import ./lib;
      lib = baseLib.extend (
        final: _: {
          nixosSystem = args: import ./nixos/eval-config.nix ({ lib = final; } // args);
        }
      );
    in
    {
      inherit lib;
      legacyPackages.x86_64-linux = import ./. { inherit lib; };
    };
}
