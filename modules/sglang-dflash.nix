# services.sglang-dflash: SGLang DFlash/DDTree servers as hardened systemd services.
#
# Each instance becomes sglang-dflash-<name>.service. Nix only writes the instance config as
# JSON (keys = the option names below); `sglang-dflash serve` validates it and renders
# SGLang's argv -- the one renderer (src/sglang_dflash/config.py). The systemd directives
# and their reasons come from src/sglang_dflash/unit-hardening.json, which
# `sglang-dflash unit` (the same unit for non-NixOS hosts) reads too.
{ config, lib, pkgs, ... }:
let
  inherit (lib) mkOption mkEnableOption types literalExpression;

  cfg = config.services.sglang-dflash;
  shared = lib.importJSON ../src/sglang_dflash/unit-hardening.json;
  directives = entries: lib.listToAttrs (map (e: lib.nameValuePair e.key e.value) entries);

  # Ranges, the instance-name pattern and the start-timeout margin, shared with
  # sglang_dflash.config (one data file, read by both).
  limits = lib.importJSON ../src/sglang_dflash/limits.json;
  secretFlags = import ../nix/secret-flags.nix { inherit lib; };
  between = r: types.ints.between r.min r.max;
  startTimeoutMargin = limits.startTimeoutMarginS;
  wildcardHosts = [ "0.0.0.0" "::" ];
  nnodesOf = i: if i.multiNode == null then 1 else i.multiNode.nnodes;

  # Models fetched ahead (issue 17; sglang_dflash.config is_local_model / default_offline):
  # a local directory is absolute or ./-relative, anything else is a hub id; a pinned
  # revision is a 40-hex commit. The draft counts only when the instance speculates.
  isLocal = m: lib.hasPrefix "/" m || lib.hasPrefix "./" m || lib.hasPrefix "../" m
    || m == "." || m == "..";
  isPinned = r: r != null && builtins.match limits.pinnedRevision r != null;
  modelsOf = i: [ { key = "model"; m = i.model; r = i.modelRevision; } ]
    ++ lib.optional (i.algorithm != "none" && i.draftModel != null)
      { key = "draftModel"; m = i.draftModel; r = i.draftModelRevision; };
  hubModelsOf = i: lib.filter (x: !(isLocal x.m)) (modelsOf i);
  offlineOf = i: if i.offline != null then i.offline
    else lib.all (x: isLocal x.m || isPinned x.r) (modelsOf i);

  # Shapes checked by the option types; each pattern is limits.json's, which
  # sglang_dflash.config checks too. A path written into a unit line: absolute, and no control
  # character (a newline would start a new directive).
  unitPath = types.strMatching limits.unitPath;
  # An option that takes no value: its type refuses any, naming the reason but not the value
  # (an inline key must not be echoed either).
  refused = why: lib.mkOptionType {
    name = "refused";
    description = "nothing (${why})";
    merge = loc: _: throw "The option `${lib.showOption loc}' is refused: ${why}.";
  };

  instanceModule = { name, config, ... }: {
    options = {
      enable = mkEnableOption "this SGLang DFlash/DDTree instance" // { default = true; };

      name = mkOption {
        # The pattern is limits.json's instanceName, the one sglang_dflash.config checks.
        type = types.strMatching limits.instanceName;
        default = name;
        readOnly = true;
        defaultText = literalExpression "<the attribute name>";
        description = ''
          The instance name (its attribute name under instances). It names the unit
          sglang-dflash-<name>.service, its DynamicUser and its state, cache and runtime
          directories, so it must match the instanceName pattern of
          src/sglang_dflash/limits.json (the project's validator checks the same pattern).
        '';
      };

      package = mkOption {
        type = types.package;
        default = cfg.package;
        defaultText = literalExpression "config.services.sglang-dflash.package";
        description = "The sglang-dflash package (pinned SGLang + DDTree overlay + CLI) this instance runs.";
      };

      model = mkOption {
        type = types.str;
        example = "Qwen/Qwen3-8B";
        description = ''
          Target model: a local directory or a Hugging Face hub id (downloaded into the
          instance's cache directory on first start; give HF_TOKEN via environmentFile).
        '';
      };
      modelRevision = mkOption {
        type = types.nullOr types.str;
        default = null;
        description = "Hub revision (branch, tag or commit) of model; pin a commit for reproducibility.";
      };
      draftModel = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "z-lab/Qwen3-8B-DFlash-b16";
        description = "DFlash draft model (local directory or hub id); required unless algorithm is \"none\".";
      };
      draftModelRevision = mkOption {
        type = types.nullOr types.str;
        default = null;
        description = "Hub revision of draftModel.";
      };
      offline = mkOption {
        type = types.nullOr types.bool;
        default = null;
        description = ''
          Serve with HF_HUB_OFFLINE=1: every model is a local directory or a hub id pinned to
          a commit (modelRevision / draftModelRevision = 40 hex digits), fetched ahead into
          the instance's cache by sglang-dflash-<name>-models.service (fetchModels). null:
          offline exactly when every model is local or pinned; true with an unpinned hub id
          fails evaluation. See docs/service.md, "Models offline".
        '';
      };
      fetchModels = mkOption {
        type = types.bool;
        default = offlineOf config && hubModelsOf config != [ ];
        defaultText = literalExpression "offline && <a model or draftModel is a hub id>";
        description = ''
          Run sglang-dflash-<name>-models.service (a oneshot: `sglang-dflash fetch-models`,
          bounded retries, network allowed, no GPU) before the server, which Requires= and is
          After= it. The snapshots land in /var/cache/sglang-dflash-<name>/huggingface/hub,
          which survives restarts; a present snapshot is not fetched again.
        '';
      };

      algorithm = mkOption {
        type = types.enum [ "dflash" "ddtree" "none" ];
        default = "dflash";
        description = ''
          Speculative decoding: "dflash" (SGLang's DFLASH, one draft block), "ddtree" (the
          DDTree mode of DFLASH: a draft tree of ddtree.budget nodes verified in one pass),
          or "none" (no speculation; a baseline).
        '';
      };
      ddtree.budget = mkOption {
        type = between limits.ddtreeBudget;
        default = limits.ddtreeBudget.default;
        description = ''
          DDTree node budget: the verify width is budget + 1 tokens per request.
          Only used when algorithm = "ddtree".
        '';
      };
      ddtree.policy = mkOption {
        type = types.strMatching "fixed|adaptive(:.+)?";
        default = "fixed";
        example = "adaptive";
        description = ''
          How many of the budget's nodes each decode round uses. "fixed": every round
          verifies budget + 1 tokens. "adaptive": per batch size, the budget among 0 (no
          draft), a ladder below it and the budget itself that earns the most tokens per
          millisecond, measured online ("adaptive:auto:<token cap>" sets the cap of
          batch size x (n + 1) verified tokens; "adaptive:1:0,7,15;8:0,3" gives the
          candidates per batch-size range). The schedule is checked when the system is
          built, by the package's own validator. See docs/ddtree.md, "Adaptive budget".
        '';
      };
      blockSize = mkOption {
        type = types.nullOr (between limits.blockSize);
        default = null;
        description = "DFlash block size (--speculative-dflash-block-size); null reads it from the draft model's config.";
      };

      host = mkOption {
        type = types.str;
        default = "127.0.0.1";
        description = "Address SGLang listens on.";
      };
      port = mkOption {
        type = types.port;
        default = 30000;
        description = "TCP port SGLang listens on.";
      };
      gpus = mkOption {
        type = types.listOf types.ints.unsigned;
        default = [ 0 ];
        example = [ 2 3 ];
        description = ''
          GPU indices this instance owns (CUDA_VISIBLE_DEVICES). No GPU may belong to two
          instances. An empty list leaves CUDA_VISIBLE_DEVICES unset (all GPUs visible).
        '';
      };
      tensorParallelSize = mkOption {
        type = between limits.tensorParallelSize;
        default = lib.max 1 (builtins.length config.gpus) * nnodesOf config;
        defaultText = literalExpression "max 1 (length gpus) * (multiNode.nnodes or 1)";
        description = "Tensor-parallel size (--tp-size); must equal the number of GPUs (times multiNode.nnodes).";
      };
      # Issue 17: metrics and multi-node tensor parallelism (docs/router.md).
      metrics.enable = mkEnableOption "SGLang's Prometheus metrics on /metrics (--enable-metrics)";
      multiNode = mkOption {
        type = types.nullOr (types.submodule {
          options = {
            nnodes = mkOption {
              type = types.ints.between 2 limits.tensorParallelSize.max;
              description = "Number of hosts the tensor-parallel group spans (--nnodes).";
            };
            nodeRank = mkOption {
              type = types.ints.unsigned;
              description = "This host's rank (--node-rank); rank 0 serves HTTP.";
            };
            distInitAddr = mkOption {
              type = types.strMatching limits.distInitAddr;
              example = "10.0.0.1:20000";
              description = "host:port of rank 0's torch.distributed store, the same on every node (--dist-init-addr).";
            };
          };
        });
        default = null;
        description = ''
          Multi-node tensor parallelism: this instance is one rank of a group spanning nnodes
          hosts (tensorParallelSize counts the GPUs of all of them). Only rank 0 serves HTTP.
        '';
      };
      memFractionStatic = mkOption {
        type = types.nullOr (types.numbers.between 0 1);
        default = null;
        example = 0.8;
        description = "Fraction of GPU memory for weights and KV cache (--mem-fraction-static); null lets SGLang choose.";
      };
      attentionBackend = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "flashinfer";
        description = "SGLang attention backend (--attention-backend), e.g. flashinfer or triton; null lets SGLang choose.";
      };
      draftAttentionBackend = mkOption {
        type = types.nullOr types.str;
        default = null;
        description = "Attention backend of the draft model (--speculative-draft-attention-backend).";
      };
      contextLength = mkOption {
        type = types.nullOr (between limits.contextLength);
        default = null;
        description = "Maximum context length (--context-length); null uses the model's.";
      };
      maxRunningRequests = mkOption {
        type = types.nullOr (between limits.maxRunningRequests);
        default = null;
        description = ''
          Maximum concurrently running requests (--max-running-requests). null keeps SGLang's
          default, which is 48 on a speculative server (DFLASH, DDTree): more requests wait in
          its queue, so above 48 at once such a server falls behind no speculation
          (docs/ddtree.md). Set it above the concurrency the instance serves (a cap equal to
          it stalled admissions for a whole wave: docs/gpu-results.md §37); each batch size
          above 48 adds CUDA graphs (4B-shaped Qwen3 on an H100 at 64: ~19 s more start,
          ~1.8 GB more graph memory; §36).
        '';
      };
      servedModelName = mkOption {
        type = types.nullOr types.str;
        default = null;
        description = "Model name reported by /v1/models (--served-model-name).";
      };
      loadFormat = mkOption {
        type = types.nullOr types.str;
        default = null;
        example = "dummy";
        description = "Weight load format (--load-format); \"dummy\" for random-weight test runs.";
      };
      draftLoadFormat = mkOption {
        type = types.nullOr types.str;
        default = null;
        description = "Draft weight load format (--speculative-draft-load-format).";
      };
      skipTokenizerInit = mkOption {
        type = types.bool;
        default = false;
        description = "Skip loading the tokenizer (--skip-tokenizer-init); requests must send input_ids.";
      };

      apiKeyFile = mkOption {
        type = types.nullOr unitPath;
        default = null;
        example = "/run/secrets/sglang-api-key";
        description = ''
          File holding the API key (one line), an absolute path outside the Nix store (the
          build-time validator refuses a store path). Loaded with systemd's LoadCredential=,
          so it may be readable by root only; it is never copied into the Nix store and never
          appears on a command line (serve hands it to SGLang through a 0600 config file).
        '';
      };
      apiKey = mkOption {
        type = types.nullOr (refused "an inline API key would land in the world-readable Nix store; put it in a file and set apiKeyFile");
        default = null;
        visible = false;
        description = "Refused: an inline key would land in the world-readable Nix store. Use apiKeyFile.";
      };
      environment = mkOption {
        type = types.attrsOf types.str;
        default = { };
        example = { NCCL_DEBUG = "WARN"; };
        description = "Extra environment for SGLang (not for secrets: it is in the store).";
      };
      environmentFile = mkOption {
        type = types.nullOr unitPath;
        default = null;
        example = "/run/secrets/sglang-env";
        description = "EnvironmentFile= for secrets such as HF_TOKEN.";
      };
      extraArgs = mkOption {
        type = types.listOf types.str;
        default = [ ];
        example = [ "--cuda-graph-max-bs" "8" ];
        description = "Extra SGLang arguments, appended after the rendered ones.";
      };
      openFirewall = mkOption {
        type = types.bool;
        default = false;
        description = "Open port in the firewall.";
      };
      preflight = mkOption {
        type = types.bool;
        default = true;
        description = "Run `sglang-dflash check --offline --config <instance config>` in ExecStartPre (it also validates the config): a broken environment never starts, and the journal says why.";
      };
      freezeGc = mkOption {
        type = types.bool;
        default = true;
        description = ''
          Once SGLang answers /health (its own warm-up request done), serve POSTs SGLang's
          /freeze_gc so the Python collectors' full passes skip everything alive after the
          start. Without it each server stalled every request in flight once, ~0.4 s, at its
          first full collection (docs/service.md, "freezeGc"). A server that refuses is still
          served, with one line in the journal.
        '';
      };
      startTimeout = mkOption {
        type = between limits.startTimeout;
        default = 1800;
        description = ''
          Seconds SGLang may take to answer /health (weights download, kernel JIT, CUDA graph
          capture). A child that dies earlier fails the start at once.
        '';
      };
      user = mkOption {
        type = types.nullOr types.str;
        default = null;
        description = "Static user to run as; null uses DynamicUser.";
      };
      group = mkOption {
        type = types.nullOr types.str;
        default = null;
        description = "Static group (with user); null uses the user's name.";
      };

      finalConfig = mkOption {
        type = types.attrs;
        internal = true;
        readOnly = true;
        description = "The instance config that serve reads (written to the store as JSON).";
      };
    };

    config.finalConfig = {
      inherit (config) name;
      inherit (config) model modelRevision draftModel draftModelRevision algorithm blockSize
        host port gpus tensorParallelSize memFractionStatic attentionBackend
        draftAttentionBackend contextLength maxRunningRequests servedModelName apiKeyFile
        environment extraArgs preflight freezeGc startTimeout loadFormat draftLoadFormat
        skipTokenizerInit multiNode offline;
      metrics = { inherit (config.metrics) enable; };
      ddtree = { inherit (config.ddtree) budget policy; };
      cacheDir = "/var/cache/sglang-dflash-${config.name}";
    };
  };

  enabled = lib.filterAttrs (_: i: i.enable) cfg.instances;
  names = lib.attrNames enabled;

  # --- assertions ------------------------------------------------------------------------
  pairs = lib.concatLists (lib.imap0
    (ia: a: map (b: { inherit a b; }) (lib.drop (ia + 1) names))
    names);
  sameSocket = p:
    let x = enabled.${p.a}; y = enabled.${p.b}; in
    x.port == y.port
    && (x.host == y.host || lib.elem x.host wildcardHosts || lib.elem y.host wildcardHosts);
  socketAssertions = map
    (p: {
      assertion = !(sameSocket p);
      message = "services.sglang-dflash: instances \"${p.a}\" and \"${p.b}\" both listen on "
        + "${enabled.${p.a}.host}:${toString enabled.${p.a}.port} / "
        + "${enabled.${p.b}.host}:${toString enabled.${p.b}.port}; give each its own port.";
    })
    pairs;

  # A GPU belongs to one instance, once: counted with multiplicity over every instance's
  # gpus, so the same index twice in one list fails the same assertion.
  allGpus = lib.unique (lib.concatMap (n: enabled.${n}.gpus) names);
  gpuAssertions = map
    (g:
      let
        uses = lib.concatMap (n: map (_: n) (lib.filter (x: x == g) enabled.${n}.gpus)) names;
        users = lib.unique uses;
      in {
        assertion = builtins.length uses < 2;
        message = "services.sglang-dflash: GPU ${toString g} "
          + (if builtins.length users > 1
             then "is used by instances ${lib.concatMapStringsSep ", " (n: "\"${n}\"") users}; a GPU belongs to one instance."
             else "is listed ${toString (builtins.length uses)} times in instances.${lib.head users}.gpus; a GPU belongs to one instance, once.");
      })
    allGpus;

  # Literal paths in directives that expand systemd specifiers (%i, %h, ...): % must be %%.
  escapeSpecifiers = lib.replaceStrings [ "%" ] [ "%%" ];

  # Multi-node tensor parallelism (issue 17); sglang_dflash.config refuses the same values.
  multiNodeAssertions = name: i:
    let p = "services.sglang-dflash.instances.${name}.multiNode"; m = i.multiNode; in
    lib.optionals (m != null) [
      {
        assertion = m.nodeRank < m.nnodes;
        message = "${p}.nodeRank = ${toString m.nodeRank} must be below nnodes = ${toString m.nnodes}.";
      }
      {
        assertion = lib.mod i.tensorParallelSize m.nnodes == 0;
        message = "${p}: tensorParallelSize = ${toString i.tensorParallelSize} is not divisible by nnodes = ${toString m.nnodes}.";
      }
    ];
  # [ port ] of distInitAddr (host:port, by its type)
  distPort = i:
    let m = builtins.match ".*:([0-9]{1,5})" i.multiNode.distInitAddr; in
    lib.optional (m != null) (lib.toInt (lib.head m));

  # --- units -----------------------------------------------------------------------------
  mkService = name: i:
    let
      exe = "${i.package}/bin/sglang-dflash";
      # The instance config, validated at build time by the project's own validator (the
      # renderer serve uses), as nixpkgs checks generated configuration files: everything
      # about one instance is checked there (--sandboxed: also the paths the unit's sandbox
      # hides); the module's assertions keep what crosses instances.
      configFile =
        pkgs.runCommand "sglang-dflash-${name}.json"
          {
            nativeBuildInputs = [ i.package ];
            config = builtins.toJSON i.finalConfig;
            passAsFile = [ "config" ];
          }
          ''
            cp "$configPath" "$out"
            HOME="$(mktemp -d)" sglang-dflash serve --config "$out" --print-argv --sandboxed > /dev/null
          '';
      sub = "sglang-dflash-${name}"; # one flat directory per instance, no shared parent
      loader = "sglang-dflash-${name}-models.service";
      dirs = {
        StateDirectory = sub;
        CacheDirectory = sub;
        StateDirectoryMode = "0700";
        CacheDirectoryMode = "0700";
        WorkingDirectory = "/var/lib/${sub}";
      };
      account = lib.optionalAttrs (i.user != null) {
        User = i.user;
        Group = if i.group != null then i.group else i.user;
      };
      envFile = lib.optionalAttrs (i.environmentFile != null) { EnvironmentFile = escapeSpecifiers i.environmentFile; };
    in
    [ (lib.nameValuePair "sglang-dflash-${name}" {
      description = "SGLang DFlash/DDTree server ${name} (${i.algorithm})";
      after = [ "network-online.target" "nvidia-persistenced.service" ] ++ lib.optional i.fetchModels loader;
      requires = lib.optional i.fetchModels loader;
      wants = [ "network-online.target" ];
      wantedBy = [ "multi-user.target" ];
      unitConfig = directives shared.unit;
      environment = {
        HOME = "/var/lib/${sub}";
        # The NVIDIA driver's libcuda.so.1 on NixOS; Triton looks for libcuda there too.
        LD_LIBRARY_PATH = "/run/opengl-driver/lib";
        TRITON_LIBCUDA_PATH = "/run/opengl-driver/lib";
        PYTHONUNBUFFERED = "1";
      };
      serviceConfig = directives shared.lifecycle // directives shared.hardening // dirs // {
        TimeoutStartSec = "${toString (i.startTimeout + startTimeoutMargin)}s";
        DynamicUser = i.user == null;
        RuntimeDirectory = sub;
        RuntimeDirectoryMode = "0700";
        ExecStart = "${exe} serve --config ${configFile}";
      }
      // lib.optionalAttrs i.preflight { ExecStartPre = "${exe} check --offline --config ${configFile}"; }
      // account
      // lib.optionalAttrs (i.apiKeyFile != null) { LoadCredential = "api-key:${escapeSpecifiers i.apiKeyFile}"; }
      // envFile;
    }) ]
    # The model loader (like nixpkgs' ollama loadModels, but BEFORE the server): the server's
    # user (a DynamicUser of the same name), state and cache directories; no GPU, network on.
    # No RuntimeDirectory: systemd removes it when a unit stops, and the server's lives there.
    ++ lib.optional i.fetchModels (lib.nameValuePair "sglang-dflash-${name}-models" {
      description = "SGLang DFlash/DDTree models of ${name} (fetched before the server)";
      after = [ "network-online.target" ];
      wants = [ "network-online.target" ];
      before = [ "sglang-dflash-${name}.service" ];
      unitConfig = directives shared.modelsUnit;
      environment = { HOME = "/var/lib/${sub}"; PYTHONUNBUFFERED = "1"; };
      serviceConfig = directives shared.modelsLifecycle // directives shared.hardening
        // directives shared.modelsHardening // dirs // {
        DynamicUser = i.user == null;
        ExecStart = "${exe} fetch-models --config ${configFile}";
      }
      // lib.optionalAttrs (i.user == null) { User = sub; }
      // account
      // envFile;
    });

  staticUsers = lib.filter (i: i.user != null) (lib.attrValues enabled);
in
{
  imports = [ ./router.nix ]; # services.sglang-dflash.routers (SGLang's router, smg)

  options.services.sglang-dflash = {
    package = lib.mkPackageOption pkgs "sglang-dflash" { } // {
      description = ''
        The sglang-dflash package every instance runs unless it sets its own. The flake's
        nixosModules.default sets it (mkDefault) from the host's pkgs with the flake's
        overlay, so the module never sets nixpkgs.overlays.
      '';
    };

    instances = mkOption {
      type = types.attrsOf (types.submodule instanceModule);
      default = { };
      example = literalExpression ''
        {
          qwen3-8b = {
            model = "Qwen/Qwen3-8B";
            draftModel = "z-lab/Qwen3-8B-DFlash-b16";
            algorithm = "ddtree";
            ddtree.budget = 64;
            gpus = [ 0 ];
            port = 30000;
          };
        }
      '';
      description = "SGLang DFlash/DDTree servers; each runs as sglang-dflash-<name>.service.";
    };
  };

  config = lib.mkIf (enabled != { }) {
    # Instance names are checked by the `name` option's type (limits.json's pattern), and an
    # inline apiKey by its type (which takes no value), forced here so they fail evaluation
    # even where no unit is built. Everything else about one instance is the build-time
    # validator's (configFile); these assertions cross instances (sockets, GPUs) or fields
    # of a multi-node group.
    # The one per-instance exception: a secret flag in extraArgs is refused before the config,
    # key included, is written to the world-readable store (nix/secret-flags.nix).
    assertions = lib.deepSeq (map (i: [ i.name i.apiKey ]) (lib.attrValues enabled))
      socketAssertions ++ gpuAssertions
      ++ lib.concatLists (lib.mapAttrsToList multiNodeAssertions enabled)
      ++ lib.mapAttrsToList (n: i: let found = secretFlags limits.secretFlags.serve i.extraArgs; in {
        assertion = found == [ ];
        message = "services.sglang-dflash.instances.${n}.extraArgs: ${lib.concatStringsSep ", " found} "
          + "would put a key in the world-readable Nix store; use apiKeyFile.";
      }) enabled;

    systemd.services = lib.listToAttrs (lib.concatLists (lib.mapAttrsToList mkService enabled));

    networking.firewall.allowedTCPPorts =
      lib.concatMap (i: lib.optional i.openFirewall i.port) (lib.attrValues enabled)
      # rank 0 of a multi-node group: the other ranks reach its torch.distributed store
      ++ lib.concatMap (i: lib.optionals (i.openFirewall && i.multiNode != null
        && i.multiNode.nodeRank == 0) (distPort i)) (lib.attrValues enabled);

    users.users = lib.listToAttrs (map
      (i: lib.nameValuePair i.user {
        isSystemUser = true;
        group = if i.group != null then i.group else i.user;
      })
      staticUsers);
    users.groups = lib.listToAttrs (map
      (i: lib.nameValuePair (if i.group != null then i.group else i.user) { })
      staticUsers);
  };
}
