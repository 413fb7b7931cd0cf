# Evaluates modules/sglang-dflash.nix (through nixosModules.default) with the two-instance
# example in tests/nix/module-example.nix and asserts on the rendered units; a second
# evaluation with a clashing config must fail the module's own assertions. Everything
# is decided at evaluation time; the derivation only records the rendered units.
# Store paths are stripped of their context so this check does not build the GPU stack.
{
  lib,
  nixosSystem,
  pkgs,
  nixosModule,
  example ? ../../tests/nix/module-example.nix,
  writeText,
}:
let
  evalWith =
    extra:
    (nixosSystem {
      modules = [
        nixosModule
        example
        extra
        {
          # nixosModule takes its package from pkgs + the overlay; the CUDA toolkit is unfree.
          nixpkgs.hostPlatform = pkgs.stdenv.hostPlatform.system;
          nixpkgs.config.allowUnfree = true;
          boot.isContainer = true;
          system.stateVersion = lib.trivial.release;
        }
      ];
    }).config;

  cfg = evalWith { };
  units = cfg.systemd.services;
  names = lib.attrNames cfg.services.sglang-dflash.instances;
  unitOf = n: units."sglang-dflash-${n}";
  # The module's own assertions (the rest of a minimal NixOS config is not under test).
  failed =
    c:
    lib.filter (lib.hasInfix "sglang-dflash") (
      map (a: a.message) (lib.filter (a: !a.assertion) c.assertions)
    );

  check = cond: msg: if cond then true else throw "module-eval: ${msg}";

  checks = [
    (check (names == [
      "small"
      "tree"
    ]) "the example defines instances small and tree, got ${toString names}")
    (check (failed cfg == [ ]) "the example must pass every assertion: ${toString (failed cfg)}")
  ]
  ++ lib.concatMap (n: [
    (check (units ? "sglang-dflash-${n}") "no unit sglang-dflash-${n}.service")
    (check (
      builtins.match ".*/bin/sglang-dflash serve --config .*sglang-dflash-${n}\\.json" (unitOf n).serviceConfig.ExecStart != null
    ) "sglang-dflash-${n}: ExecStart does not run `sglang-dflash serve --config`")
    (check ((unitOf n).serviceConfig.Type or null == "notify") "sglang-dflash-${n}: Type is not notify")
    (check (
      (unitOf n).serviceConfig.DevicePolicy or null == "closed"
    ) "sglang-dflash-${n}: DevicePolicy is not closed")
  ]) names
  ++ [
    (check (
      builtins.match ".*/bin/sglang-dflash check --offline --config .*sglang-dflash-tree\\.json" (unitOf "tree").serviceConfig.ExecStartPre
      != null
    ) "sglang-dflash-tree: preflight on but no `check --offline --config` in ExecStartPre")
    (check (
      !((unitOf "small").serviceConfig ? ExecStartPre)
    ) "sglang-dflash-small: preflight off but ExecStartPre is set")
    (check (
      cfg.services.sglang-dflash.instances.tree.finalConfig.gpus == [ 1 ]
      && cfg.services.sglang-dflash.instances.small.finalConfig.gpus == [ 0 ]
    ) "instances must own GPUs [0] and [1]")
    (check (
      cfg.networking.firewall.allowedTCPPorts == [ 30001 ]
    ) "only the tree instance opens its port (30001)")
  ];

  # Both instances on one socket and one GPU: the module must refuse with messages.
  clash = evalWith {
    services.sglang-dflash.instances.small = {
      port = lib.mkForce 30001;
      gpus = lib.mkForce [ 1 ];
    };
  };
  clashMessages = lib.concatStringsSep "\n" (failed clash);
  clashChecks = [
    (check (builtins.match ".*both listen on.*" clashMessages != null) "no host:port clash assertion")
    (check (builtins.match ".*GPU 1 is used by.*" clashMessages != null) "no shared-GPU assertion")
  ];

  rendered = lib.mapAttrs (
    n: _:
    builtins.unsafeDiscardStringContext (
      builtins.toJSON {
        inherit ((unitOf n).serviceConfig) ExecStart Type;
        ExecStartPre = (unitOf n).serviceConfig.ExecStartPre or null;
      }
    )
  ) cfg.services.sglang-dflash.instances;
in
assert lib.all (x: x) (checks ++ clashChecks);
writeText "sglang-dflash-module-eval.json" (builtins.toJSON rendered)
