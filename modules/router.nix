# services.sglang-dflash.routers.<name>: SGLang's router (smg, pinned in pins.toml) in front of
# local instances and/or remote workers, as its own hardened unit
# sglang-dflash-router-<name>.service. Imported by ./sglang-dflash.nix.
#
# As for instances, Nix only writes the router config as JSON (keys = the option names below);
# `sglang-dflash router` validates it and renders smg's argv (src/sglang_dflash/router.py, the
# one renderer). A local instance is passed as its instance config file, so its URL comes
# from its own host/port there, never restated here. Readiness: the launcher sends READY=1
# (Type=notify) once the router answers /health.
{ config, lib, pkgs, ... }:
let
  inherit (lib) mkOption mkEnableOption types literalExpression;

  top = config.services.sglang-dflash;
  cfg = top.routers;
  shared = lib.importJSON ../src/sglang_dflash/unit-hardening.json;
  limits = lib.importJSON ../src/sglang_dflash/limits.json;
  secretFlags = import ../nix/secret-flags.nix { inherit lib; };
  directives = entries: lib.listToAttrs (map (e: lib.nameValuePair e.key e.value) entries);
  instances = lib.filterAttrs (_: i: i.enable) top.instances;
  isUrl = w: builtins.match "https?://.*" w != null;
  # A path written into a unit line (limits.json's unitPath, as for instances).
  unitPath = types.strMatching limits.unitPath;
  nullInt = lo: hi: description: mkOption {
    type = types.nullOr (types.ints.between lo hi);
    default = null;
    inherit description;
  };

  routerModule = { name, config, ... }: {
    options = {
      enable = mkEnableOption "this router" // { default = true; };
      name = mkOption {
        # limits.json's instanceName, as for instances: the name is part of a unit name.
        type = types.strMatching limits.instanceName;
        default = name;
        readOnly = true;
        defaultText = literalExpression "<the attribute name>";
        description = ''
          The router name (its attribute name under routers). It names the unit
          sglang-dflash-router-<name>.service and its runtime directory, so it must match
          the instanceName pattern of src/sglang_dflash/limits.json.
        '';
      };
      package = mkOption {
        type = types.package;
        default = top.package;
        defaultText = literalExpression "config.services.sglang-dflash.package";
        description = "The sglang-dflash package (it carries smg, its `router` extra).";
      };
      workers = mkOption {
        type = types.nonEmptyListOf types.str;
        example = [ "qwen-a" "qwen-b" "http://10.0.0.7:30000" ];
        description = ''
          Workers: names of local instances (services.sglang-dflash.instances; the router
          unit starts after them) and/or http(s)://host:port URLs of other hosts' servers.
        '';
      };
      policy = mkOption {
        type = types.enum limits.routerPolicies;
        default = "cache_aware";
        description = "smg's routing policy (--policy).";
      };
      host = mkOption { type = types.str; default = "127.0.0.1"; description = "Address the router listens on."; };
      port = mkOption { type = types.port; default = limits.routerDefaultPort; description = "TCP port the router listens on."; };
      healthCheck = {
        intervalSecs = nullInt 1 86400 "Seconds between worker health checks (null: smg's default, 60).";
        timeoutSecs = nullInt 1 3600 "Timeout of one health check (null: smg's default, 5). SGLang 0.5.17's /health answers a server that is up after a one-token generation and a 1 s wait, so 1 is refused unless endpoint names a faster path.";
        failureThreshold = nullInt 1 1000 "Failed checks before a worker is taken out.";
        successThreshold = nullInt 1 1000 "Passed checks before it is taken back.";
        endpoint = mkOption { type = types.nullOr types.str; default = null; description = "Health endpoint (smg's default /health)."; };
      };
      retry = {
        enable = mkOption { type = types.bool; default = true; description = "Retry a failed request on another worker."; };
        maxRetries = nullInt 0 100 "Retries per request.";
        initialBackoffMs = nullInt 1 3600000 "First retry delay.";
        maxBackoffMs = nullInt 1 3600000 "Largest retry delay.";
      };
      circuitBreaker.enable = mkOption { type = types.bool; default = true; description = "smg's per-worker circuit breaker."; };
      requestTimeoutSecs = nullInt 1 604800 "Request timeout (--request-timeout-secs).";
      workerStartupTimeoutSecs = nullInt 1 604800 "How long smg waits for a worker to become healthy.";
      shutdownGraceSecs = mkOption { type = types.ints.between 0 3600; default = 25; description = "Graceful shutdown (below the unit's stop timeout)."; };
      apiKeyFile = mkOption {
        type = types.nullOr unitPath;
        default = null;
        description = ''
          File holding the API key (LoadCredential=, never in the store or on a command line:
          the build-time validator refuses a store path).
          smg asks it of its clients and sends it to its workers, so workers with a key must
          have this same key.
        '';
      };
      metrics = {
        host = mkOption { type = types.nullOr types.str; default = null; description = "Prometheus listener address (null: the router's host; smg alone would bind 0.0.0.0)."; };
        port = mkOption { type = types.port; default = limits.routerDefaultMetricsPort; description = "Prometheus listener port (smg's /metrics)."; };
      };
      logLevel = mkOption { type = types.nullOr (types.enum [ "debug" "info" "warn" "error" ]); default = null; description = "smg's log level."; };
      extraArgs = mkOption { type = types.listOf types.str; default = [ ]; description = "Extra smg arguments, appended."; };
      startTimeout = mkOption { type = types.ints.between 1 604800; default = 300; description = "Seconds the router may take to answer /health."; };
      openFirewall = mkOption { type = types.bool; default = false; description = "Open the router's port (not the metrics port)."; };
      environmentFile = mkOption { type = types.nullOr unitPath; default = null; description = "EnvironmentFile= for the router."; };
    };
  };

  enabled = lib.filterAttrs (_: r: r.enable) cfg;
  # The instance's config as the instance unit writes it (same JSON: finalConfig).
  instanceFile = n: pkgs.writeText "sglang-dflash-${n}.json" (builtins.toJSON instances.${n}.finalConfig);
  workerEntry = w: if isUrl w then w else "${instanceFile w}";
  localOf = r: lib.filter (w: !(isUrl w) && instances ? ${w}) r.workers;

  routerJSON = name: r: {
    inherit name;
    workers = map workerEntry (lib.filter (w: isUrl w || instances ? ${w}) r.workers);
    inherit (r) policy host port apiKeyFile logLevel extraArgs startTimeout shutdownGraceSecs
      requestTimeoutSecs workerStartupTimeoutSecs;
    healthCheck = { inherit (r.healthCheck) intervalSecs timeoutSecs failureThreshold successThreshold endpoint; };
    retry = { inherit (r.retry) enable maxRetries initialBackoffMs maxBackoffMs; };
    circuitBreaker = { inherit (r.circuitBreaker) enable; };
    metrics = { inherit (r.metrics) host port; };
  };

  # Every socket a host binds: instances' ports, routers' ports and metrics ports.
  sockets = lib.mapAttrsToList (n: i: { who = "instance \"${n}\""; inherit (i) port; }) instances
    ++ lib.concatLists (lib.mapAttrsToList (n: r: [
      { who = "router \"${n}\""; inherit (r) port; }
      { who = "router \"${n}\" (metrics)"; port = r.metrics.port; }
    ]) enabled);
  clashes = port: lib.filter (s: s.port == port) sockets;

  # What crosses the router and the instances; the router's own fields are the build-time
  # validator's (`sglang-dflash router --config … --print-argv`, configFile below).
  routerAssertions = name: r:
    let
      p = "services.sglang-dflash.routers.${name}";
      leaked = secretFlags limits.secretFlags.router r.extraArgs;
    in
    # A secret flag is refused here, before the config reaches the world-readable store.
    [{
      assertion = leaked == [ ];
      message = "${p}.extraArgs: ${lib.concatStringsSep ", " leaked} would put a secret in the world-readable Nix store; use apiKeyFile.";
    }]
    ++ map (w: {
      assertion = isUrl w || instances ? ${w};
      message = "${p}.workers: \"${w}\" is neither an enabled instance of services.sglang-dflash.instances nor an http(s):// URL.";
    }) r.workers
    ++ map (w: {
      assertion = instances.${w}.multiNode == null || instances.${w}.multiNode.nodeRank == 0;
      message = "${p}.workers: instance \"${w}\" is node rank ${toString instances.${w}.multiNode.nodeRank} of a multi-node group; only rank 0 serves HTTP.";
    }) (localOf r)
    ++ map (w: {
      assertion = instances.${w}.apiKeyFile == null || r.apiKeyFile != null;
      message = "${p}: worker instance \"${w}\" requires an API key; set ${p}.apiKeyFile (the same key).";
    }) (localOf r)
    ++ map (port: {
      assertion = builtins.length (clashes port) < 2;
      message = "${p}: port ${toString port} is used by ${lib.concatMapStringsSep ", " (s: s.who) (clashes port)}; give each its own port.";
    }) [ r.port r.metrics.port ];

  mkRouter = name: r:
    let
      exe = "${r.package}/bin/sglang-dflash";
      configFile =
        pkgs.runCommand "sglang-dflash-router-${name}.json"
          {
            nativeBuildInputs = [ r.package ];
            config = builtins.toJSON (routerJSON name r);
            passAsFile = [ "config" ];
          }
          ''
            cp "$configPath" "$out"
            HOME="$(mktemp -d)" sglang-dflash router --config "$out" --print-argv > /dev/null
          '';
      sub = "sglang-dflash-router-${name}";
      local = map (w: "sglang-dflash-${w}.service") (localOf r);
    in
    lib.nameValuePair sub {
      description = "SGLang router (smg) ${name}: ${r.policy}";
      after = [ "network-online.target" ] ++ local;
      wants = [ "network-online.target" ] ++ local;
      wantedBy = [ "multi-user.target" ];
      unitConfig = directives shared.unit;
      environment = { HOME = "/var/lib/${sub}"; PYTHONUNBUFFERED = "1"; };
      serviceConfig = directives shared.lifecycle // directives shared.hardening
        // directives shared.routerHardening // {
        TimeoutStartSec = "${toString (r.startTimeout + limits.startTimeoutMarginS)}s";
        DynamicUser = true;
        StateDirectory = sub;
        RuntimeDirectory = sub;
        StateDirectoryMode = "0700";
        RuntimeDirectoryMode = "0700";
        WorkingDirectory = "/var/lib/${sub}";
        ExecStart = "${exe} router --config ${configFile}";
      }
      // lib.optionalAttrs (r.apiKeyFile != null) { LoadCredential = "api-key:${lib.replaceStrings [ "%" ] [ "%%" ] r.apiKeyFile}"; }
      // lib.optionalAttrs (r.environmentFile != null) { EnvironmentFile = lib.replaceStrings [ "%" ] [ "%%" ] r.environmentFile; };
    };
in
{
  options.services.sglang-dflash.routers = mkOption {
    type = types.attrsOf (types.submodule routerModule);
    default = { };
    example = literalExpression ''
      { front = { workers = [ "qwen-a" "qwen-b" ]; policy = "cache_aware"; port = 8000; }; }
    '';
    description = "SGLang routers (smg); each runs as sglang-dflash-router-<name>.service.";
  };

  config = lib.mkIf (enabled != { }) {
    # deepSeq: the name option's type (strMatching) is checked only when the value is read.
    assertions = lib.deepSeq (map (r: r.name) (lib.attrValues enabled))
      (lib.concatLists (lib.mapAttrsToList routerAssertions enabled));
    systemd.services = lib.mapAttrs' mkRouter enabled;
    networking.firewall.allowedTCPPorts =
      lib.concatMap (r: lib.optional r.openFirewall r.port) (lib.attrValues enabled);
  };
}
