# A NixOS-style evaluation of nixosModules.default's module file through the NixOS stand-in
# (tests/nix/nixpkgs-standin/nixos, real lib), run by Nix 2.26 in the harness:
#   nix-instantiate --eval --strict --json module-case.nix --arg standin /h/nixpkgs \
#     --arg src /h/src --argstr case two-instances
# Cases: the two-instance example (prints both units), and configurations that must fail
# with the module's assertion messages or NixOS's own type errors (one instance's own values
# are the build-time validator's, which a stand-in package does not run).
{
  standin,
  src,
  case,
}:
let
  lib = import (standin + "/lib");
  example = import (src + "/tests/nix/module-example.nix");
  cases = {
    two-instances = { };
    same-port.services.sglang-dflash.instances.small = {
      port = lib.mkForce 30001;
    };
    same-gpu.services.sglang-dflash.instances.small.gpus = lib.mkForce [ 1 ];
    bad-port.services.sglang-dflash.instances.small.port = lib.mkForce "abc";
    bad-algorithm.services.sglang-dflash.instances.small.algorithm = lib.mkForce "bogus";
    misspelt-option.services.sglang-dflash.instances.small.draftModle = "x";
    bad-budget.services.sglang-dflash.instances.tree.ddtree.budget = lib.mkForce 0;
    gpu-twice.services.sglang-dflash.instances.small.gpus = lib.mkForce [ 0 0 ];
    # Scale-out: a router over both instances, the DDTree instance on two nodes (rank 0) with
    # metrics and pinned hub revisions (so offline, with its model loader unit).
    scale-out.services.sglang-dflash = {
      instances.tree = {
        modelRevision = "0123456789abcdef0123456789abcdef01234567";
        draftModelRevision = "89abcdef0123456789abcdef0123456789abcdef";
        metrics.enable = true;
        gpus = lib.mkForce [ 1 2 ];
        multiNode = {
          nnodes = 2;
          nodeRank = 0;
          distInitAddr = "10.0.0.1:20000";
        };
      };
      routers.front = {
        workers = [ "small" "tree" ];
        port = 8000;
      };
    };
    bad-router-name.services.sglang-dflash.routers."r x".workers = [ "small" ];
    # shapes in the option types (limits.json's patterns): NixOS's type error, or a type
    # that takes no value and says why without echoing it
    bad-dist-addr.services.sglang-dflash.instances.tree = {
      gpus = lib.mkForce [ 1 2 ];
      multiNode = {
        nnodes = 2;
        nodeRank = 0;
        distInitAddr = "10.0.0.1";
      };
    };
    inline-key.services.sglang-dflash.instances.small.apiKey = "sk-REALNIX-1";
    bad-name.services.sglang-dflash.instances."a b" = {
      model = "m";
      algorithm = "none";
      gpus = [ 7 ];
      port = 30007;
    };
  };
  config =
    (import (standin + "/nixos/eval-config.nix") {
      inherit lib;
      modules = [
        (src + "/modules/sglang-dflash.nix")
        example
        cases.${case}
        {
          nixpkgs.hostPlatform = "x86_64-linux";
          services.sglang-dflash.package = (import standin { inherit lib; }).writeShellScriptBin "sglang-dflash" "";
        }
      ];
    }).config;
  unit = n: config.systemd.services."sglang-dflash-${n}";
in
# Forcing the toplevel throws NixOS's "Failed assertions:" list, as nixos-rebuild would.
builtins.seq config.system.build.toplevel.drvPath {
  units = lib.genAttrs [ "small" "tree" ] (n: {
    inherit (unit n) description after wantedBy;
    serviceConfig = lib.mapAttrs (_: v: if lib.isDerivation v then "${v}" else v) (unit n).serviceConfig;
    environment = (unit n).environment;
  });
  firewall = config.networking.firewall.allowedTCPPorts;
  scaleOut = lib.optionalAttrs (case == "scale-out") (
    let
      svc = config.systemd.services;
      str = v: if lib.isDerivation v then "${v}" else v;
    in
    {
      router = {
        inherit (svc.sglang-dflash-router-front) after wants;
        serviceConfig = lib.mapAttrs (_: str) svc.sglang-dflash-router-front.serviceConfig;
      };
      loader = lib.mapAttrs (_: str) svc.sglang-dflash-tree-models.serviceConfig;
      tree = { inherit (unit "tree") after requires; };
    }
  );
}
