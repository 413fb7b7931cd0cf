{
  description = "SGLang 0.5.17 with DFlash/DDTree speculative decoding: pinned package, NixOS module, self-check";

  inputs = {
    # A nixos-unstable revision with cudaPackages_13_0; see docs/nix.md for how it was chosen.
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

    pyproject-nix = {
      url = "github:pyproject-nix/pyproject.nix";
      inputs.nixpkgs.follows = "nixpkgs";
    };

    uv2nix = {
      url = "github:pyproject-nix/uv2nix";
      inputs.pyproject-nix.follows = "pyproject-nix";
      inputs.nixpkgs.follows = "nixpkgs";
    };

    pyproject-build-systems = {
      url = "github:pyproject-nix/build-system-pkgs";
      inputs.pyproject-nix.follows = "pyproject-nix";
      inputs.uv2nix.follows = "uv2nix";
      inputs.nixpkgs.follows = "nixpkgs";
    };
  };

  # Wiring only: derivations live in pkgs/, overlays in overlays/, the module in modules/.
  outputs =
    {
      self,
      nixpkgs,
      pyproject-nix,
      uv2nix,
      pyproject-build-systems,
    }:
    let
      system = "x86_64-linux";
      inherit (nixpkgs) lib;

      overlay = import ./overlays {
        inherit uv2nix pyproject-nix pyproject-build-systems;
        workspaceRoot = ./.;
      };

      pkgs = import nixpkgs {
        inherit system;
        # The CUDA toolkit (CUDA_HOME for run-time JIT) is unfree.
        config.allowUnfree = true;
        overlays = [ overlay ];
      };

      # The module takes its default package from the host's own pkgs plus this flake's
      # overlay, without setting nixpkgs.overlays: a NixOS configuration with read-only pkgs
      # (nixpkgs.pkgs, as testers.runNixOSTest's nodes have) must be able to import it.
      nixosModule =
        { lib, pkgs, ... }:
        {
          imports = [ ./modules/sglang-dflash.nix ];
          services.sglang-dflash.package = lib.mkDefault (pkgs.sglang-dflash or (overlay pkgs pkgs).sglang-dflash);
        };
    in
    {
      overlays.default = overlay;

      packages.${system} = {
        default = pkgs.sglang-dflash;
        inherit (pkgs) sglang-dflash sglang-dflash-check;
      };

      nixosModules = {
        default = nixosModule;
        sglang-dflash = nixosModule;
      };

      devShells.${system}.default = pkgs.callPackage ./pkgs/devshell.nix { };

      # callPackages (plural): each check is overridable, the set itself gets no
      # override/overrideDerivation attributes (which `nix flake check` would reject).
      checks.${system} = pkgs.callPackages ./pkgs/checks {
        src = ./.;
        inherit (lib) nixosSystem;
        inherit nixosModule;
      };

      # A plain function call: an app is { type, program, meta } and nothing else.
      apps.${system} = import ./pkgs/apps.nix {
        inherit lib;
        inherit (pkgs) writeShellApplication sglang-dflash sglang-dflash-check;
      };

      formatter.${system} = pkgs.nixfmt-tree;
    };
}
