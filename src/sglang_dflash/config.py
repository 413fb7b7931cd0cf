"""One SGLang DFlash/DDTree instance: its config schema, validation and rendering.

The NixOS module writes an instance config as JSON whose keys are exactly the module's
option names; `sglang-dflash serve`, `sglang-dflash unit` and the bench tool read it here.
This module is the ONLY place that turns a config into SGLang's argv and environment, so
Nix never re-implements flag rendering. Everything here is pure: no I/O except
`load_config`, which only reads the file.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_dflash.errors import UserError
from sglang_dflash.sglang_overlay import settings as _overlay_settings

ALGORITHMS = ("none", "dflash", "ddtree")
# Ranges, names and margins shared with the NixOS module (its option types read the same file).
LIMITS: dict[str, Any] = json.loads(Path(__file__).with_name("limits.json").read_text())
BUDGET_MIN, BUDGET_MAX = LIMITS["ddtreeBudget"]["min"], LIMITS["ddtreeBudget"]["max"]
DEFAULT_BUDGET = LIMITS["ddtreeBudget"]["default"]
START_TIMEOUT_MARGIN_S = LIMITS["startTimeoutMarginS"]
DEFAULT_PORT = 30000
DEFAULT_START_TIMEOUT = 1800
DDTREE_BUDGET_ENV = _overlay_settings.BUDGET_ENV
DDTREE_POLICY_ENV = _overlay_settings.POLICY_ENV
CONTROL_CLASS = r"\x00-\x1f\x7f"  # POSIX's [:cntrl:] in the C locale
CONTROL_RE = re.compile(f"[{CONTROL_CLASS}]")


def shared_pattern(key: str) -> re.Pattern[str]:
    """limits.json's pattern `key`, anchored as Nix's builtins.match (types.strMatching)
    anchors it; the one POSIX class the file uses, [:cntrl:], spelled for Python's re."""
    return re.compile("^(?:" + LIMITS[key].replace("[:cntrl:]", CONTROL_CLASS) + ")$")


NAME_RE = re.compile("^" + LIMITS["instanceName"] + "$")
# an absolute path a unit line can hold (apiKeyFile; the module types environmentFile so too)
UNIT_PATH_RE = shared_pattern("unitPath")
# Files the service reads must not be in the world-readable store (a key there is public).
NIX_STORE_DIR = "/nix/store"
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Keys whose value follows a flag in SGLang's argv: a leading '-' would be parsed as a flag.
FLAG_VALUE_KEYS = (
    "model", "modelRevision", "draftModel", "draftModelRevision", "host", "attentionBackend",
    "draftAttentionBackend", "servedModelName", "loadFormat", "draftLoadFormat",
)
# Flags serve owns: a key on the command line would be readable in /proc by every local
# user, and serve passes the key through SGLang's --config file instead.
SECRET_FLAGS: tuple[str, ...] = tuple(LIMITS["secretFlags"]["serve"])
FORBIDDEN_EXTRA_ARGS = (*SECRET_FLAGS, "--config")
# Flags rendered from typed keys: giving them again in extraArgs makes two sources of truth.
TYPED_FLAGS = (
    "--model-path", "--model", "--host", "--port", "--tp-size", "--tensor-parallel-size",
    "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-draft-model",
    "--speculative-dflash-block-size", "--speculative-num-draft-tokens",
    "--enable-metrics", "--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr",
)
# host:port of rank 0's torch.distributed store: a name or IPv4 address, or a bracketed IPv6
# one (the module's multiNode.distInitAddr type is the same pattern).
DIST_ADDR_RE = shared_pattern("distInitAddr")
# A pinned Hugging Face revision: a full commit hash (branches and tags move).
COMMIT_RE = shared_pattern("pinnedRevision")
HF_OFFLINE_ENV = "HF_HUB_OFFLINE"


class ConfigError(UserError, ValueError):
    """A config that cannot be served; the message is one line and names the key."""


@dataclass(frozen=True)
class DDTreeConfig:
    budget: int = DEFAULT_BUDGET
    # "fixed" (every round at `budget`), "adaptive" (auto schedule), "adaptive:auto:<token
    # cap>" or "adaptive:<min bs>:<budgets>;..." (docs/ddtree.md "Adaptive budget")
    policy: str = "fixed"


@dataclass(frozen=True)
class MultiNodeConfig:
    """Multi-node tensor parallelism: this host is rank `node_rank` of `nnodes`."""

    nnodes: int
    node_rank: int
    dist_init_addr: str


@dataclass(frozen=True)
class InstanceConfig:
    """A validated instance config; field names are the snake_case of the JSON keys."""

    name: str
    model: str
    model_revision: str | None = None
    draft_model: str | None = None
    draft_model_revision: str | None = None
    algorithm: str = "dflash"
    ddtree: DDTreeConfig = field(default_factory=DDTreeConfig)
    block_size: int | None = None
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    gpus: tuple[int, ...] = (0,)
    tensor_parallel_size: int = 1
    mem_fraction_static: float | None = None
    attention_backend: str | None = None
    draft_attention_backend: str | None = None
    context_length: int | None = None
    max_running_requests: int | None = None
    served_model_name: str | None = None
    api_key_file: str | None = None
    environment: tuple[tuple[str, str], ...] = ()
    extra_args: tuple[str, ...] = ()
    preflight: bool = True
    start_timeout: int = DEFAULT_START_TIMEOUT
    load_format: str | None = None
    draft_load_format: str | None = None
    skip_tokenizer_init: bool = False
    # serve POSTs SGLang's /freeze_gc once the server is ready (docs/service.md, "freezeGc")
    freeze_gc: bool = True
    cache_dir: str | None = None
    metrics_enable: bool = False
    multi_node: MultiNodeConfig | None = None
    # SGLang runs with HF_HUB_OFFLINE=1: every model is a local directory or a pinned
    # snapshot fetched ahead (`sglang-dflash fetch-models`); see default_offline
    offline: bool = False

    @property
    def speculative(self) -> bool:
        return self.algorithm != "none"

    def models(self) -> tuple[tuple[str, str, str | None], ...]:
        """(key, model, revision) of every model SGLang loads: the target, and the draft
        when speculating (a draftModel of an algorithm "none" instance is never loaded)."""
        out = [("model", self.model, self.model_revision)]
        if self.speculative and self.draft_model:
            out.append(("draftModel", self.draft_model, self.draft_model_revision))
        return tuple(out)


def is_local_model(model: str) -> bool:
    """A local directory (absolute, or ./ ../ relative) rather than a Hugging Face hub id."""
    return model.startswith(("/", "./", "../")) or model in (".", "..")


def is_pinned(revision: str | None) -> bool:
    return revision is not None and COMMIT_RE.match(revision) is not None


def default_offline(models: tuple[tuple[str, str, str | None], ...]) -> bool:
    """Offline unless a hub id would be resolved at start (no revision, or a branch or tag)."""
    return all(is_local_model(m) or is_pinned(rev) for _key, m, rev in models)


# JSON key -> (python type(s), nullable). Order is the documented order.
_SCALARS: dict[str, tuple[tuple[type, ...], bool]] = {
    "name": ((str,), False),
    "model": ((str,), False),
    "modelRevision": ((str,), True),
    "draftModel": ((str,), True),
    "draftModelRevision": ((str,), True),
    "algorithm": ((str,), False),
    "blockSize": ((int,), True),
    "host": ((str,), False),
    "port": ((int,), False),
    "tensorParallelSize": ((int,), True),
    "memFractionStatic": ((int, float), True),
    "attentionBackend": ((str,), True),
    "draftAttentionBackend": ((str,), True),
    "contextLength": ((int,), True),
    "maxRunningRequests": ((int,), True),
    "servedModelName": ((str,), True),
    "apiKeyFile": ((str,), True),
    "preflight": ((bool,), False),
    "startTimeout": ((int,), False),
    "loadFormat": ((str,), True),
    "draftLoadFormat": ((str,), True),
    "skipTokenizerInit": ((bool,), False),
    "freezeGc": ((bool,), False),
    "cacheDir": ((str,), True),
    "offline": ((bool,), True),
}
KNOWN_KEYS = (*_SCALARS, "ddtree", "gpus", "environment", "extraArgs", "metrics", "multiNode")


def _type_name(types: tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}
    return " or ".join(names[t] for t in types if not (t is int and float in types))


def _check_type(key: str, value: Any, types: tuple[type, ...], nullable: bool) -> None:
    if value is None:
        if nullable:
            return
        raise ConfigError(f"{key}: must be set (got null)")
    # bool is an int subclass in Python; JSON true is never a port number.
    if isinstance(value, bool) and bool not in types:
        raise ConfigError(f"{key}: must be {_type_name(types)}, got a boolean")
    if not isinstance(value, types):
        raise ConfigError(f"{key}: must be {_type_name(types)}, got {type(value).__name__}")


def _limit(key: str, value: int | float | None) -> None:
    """`_in_range` with the range limits.json gives `key` (the module's option types too)."""
    _in_range(key, value, LIMITS[key]["min"], LIMITS[key]["max"])


def _in_range(key: str, value: int | float | None, lo: float, hi: float) -> None:
    if value is not None and not lo <= value <= hi:
        raise ConfigError(f"{key}: {value} is outside {lo}..{hi}")


def check_key_file(key: str, path: str | None) -> None:
    """An API key file (instance or router): absolute, one unit line (LoadCredential=), and
    outside the Nix store, which every local user can read."""
    if path is None:
        return
    if CONTROL_RE.search(path):
        raise ConfigError(f"{key}: must not contain control characters, got {path!r}")
    if not UNIT_PATH_RE.match(path):
        raise ConfigError(f"{key}: must be an absolute path, got {path!r}")
    if path == NIX_STORE_DIR or path.startswith(NIX_STORE_DIR + "/"):
        raise ConfigError(f"{key}: {path} is in the Nix store, which every local user can "
                          "read; keep the key outside it (e.g. /run/secrets)")


def unknown_key_message(key: str, known: tuple[str, ...] | list[str]) -> str:
    """One line for a key the schema lacks, with the closest known key when one is near."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{key}: unknown key{hint}"


def _parse_ddtree(raw: Any) -> DDTreeConfig:
    if raw is None:
        return DDTreeConfig()
    if not isinstance(raw, dict):
        raise ConfigError(f"ddtree: must be an object like {{\"budget\": 64}}, got {raw!r}")
    known = ["budget", "policy"]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else "known: " + ", ".join(known)
        raise ConfigError(f"ddtree.{unknown[0]}: unknown key ({hint})")
    budget = raw.get("budget", DEFAULT_BUDGET)
    _check_type("ddtree.budget", budget, (int,), False)
    _in_range("ddtree.budget", budget, BUDGET_MIN, BUDGET_MAX)
    policy = raw.get("policy", "fixed")
    _check_type("ddtree.policy", policy, (str,), False)
    from sglang_dflash.sglang_overlay.policy import PolicyError, parse_policy

    try:  # the worker parses the same text with the same function at start-up
        parse_policy(policy, budget, "ddtree.policy")
    except PolicyError as exc:
        raise ConfigError(str(exc)) from None
    return DDTreeConfig(budget=budget, policy=policy.strip() or "fixed")


def _parse_metrics(raw: Any) -> bool:
    """`metrics: {"enable": bool}` -> whether SGLang serves Prometheus metrics on /metrics."""
    if raw is None:
        return False
    if not isinstance(raw, dict):
        raise ConfigError(f"metrics: must be an object like {{\"enable\": true}}, got {raw!r}")
    unknown = sorted(set(raw) - {"enable"})
    if unknown:
        raise ConfigError(f"metrics.{unknown_key_message(unknown[0], ['enable'])}")
    enable = raw.get("enable", False)
    _check_type("metrics.enable", enable, (bool,), False)
    return enable


MULTI_NODE_KEYS = ("nnodes", "nodeRank", "distInitAddr")


def _parse_multi_node(raw: Any) -> MultiNodeConfig | None:
    """`multiNode: {nnodes, nodeRank, distInitAddr}`; null (or absent) is one node."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError("multiNode: must be an object like {\"nnodes\": 2, \"nodeRank\": 0, "
                          f"\"distInitAddr\": \"10.0.0.1:20000\"}}, got {raw!r}")
    unknown = sorted(set(raw) - set(MULTI_NODE_KEYS))
    if unknown:
        raise ConfigError(f"multiNode.{unknown_key_message(unknown[0], MULTI_NODE_KEYS)}")
    for key in MULTI_NODE_KEYS:
        if key not in raw:
            raise ConfigError(f"multiNode.{key}: required key is missing")
    nnodes, rank, addr = raw["nnodes"], raw["nodeRank"], raw["distInitAddr"]
    _check_type("multiNode.nnodes", nnodes, (int,), False)
    _check_type("multiNode.nodeRank", rank, (int,), False)
    _check_type("multiNode.distInitAddr", addr, (str,), False)
    _in_range("multiNode.nnodes", nnodes, 2, LIMITS["tensorParallelSize"]["max"])
    if not 0 <= rank < nnodes:
        raise ConfigError(f"multiNode.nodeRank: {rank} must be in 0..{nnodes - 1} "
                          f"(nnodes = {nnodes})")
    if not DIST_ADDR_RE.match(addr) or not 1 <= int(addr.rsplit(":", 1)[1]) <= 65535:
        raise ConfigError(f"multiNode.distInitAddr: {addr!r} is not host:port (rank 0's "
                          "address, the same on every node, e.g. 10.0.0.1:20000)")
    return MultiNodeConfig(nnodes, rank, addr)


def _parse_gpus(raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list):
        raise ConfigError(f"gpus: must be a list of GPU indices, got {type(raw).__name__}")
    for i, g in enumerate(raw):
        if isinstance(g, bool) or not isinstance(g, int) or g < 0:
            raise ConfigError(f"gpus[{i}]: must be a non-negative integer, got {g!r}")
    if len(set(raw)) != len(raw):
        raise ConfigError(f"gpus: lists a GPU index twice: {raw}")
    return tuple(raw)


def _parse_environment(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, dict):
        raise ConfigError(f"environment: must be an object of strings, got {type(raw).__name__}")
    for k, v in raw.items():
        if not ENV_NAME_RE.match(k):
            raise ConfigError(f"environment.{k!r}: not a valid environment variable name")
        if not isinstance(v, str):
            raise ConfigError(f"environment.{k}: must be a string, got {type(v).__name__}")
        if "\0" in v:  # an environment block cannot carry NUL; Popen would raise
            raise ConfigError(f"environment.{k}: must not contain a NUL character")
    if "CUDA_VISIBLE_DEVICES" in raw:
        raise ConfigError("environment.CUDA_VISIBLE_DEVICES: set the GPUs with `gpus` instead")
    if DDTREE_BUDGET_ENV in raw:
        raise ConfigError(f"environment.{DDTREE_BUDGET_ENV}: set `ddtree.budget` instead")
    if DDTREE_POLICY_ENV in raw:
        raise ConfigError(f"environment.{DDTREE_POLICY_ENV}: set `ddtree.policy` instead")
    if HF_OFFLINE_ENV in raw:
        raise ConfigError(f"environment.{HF_OFFLINE_ENV}: set `offline` instead")
    return tuple(sorted(raw.items()))


def _flag_of(arg: str) -> str:
    return arg.split("=", 1)[0]


# the SGLang flags naming an attention backend a DDTree round plans with
def _flag(arg: str) -> str:
    """The launch flag of a server_args field (``attention_backend`` -> ``--attention-backend``)."""
    return f"--{arg.replace('_', '-')}"


TARGET_ATTENTION_FLAGS = tuple(map(_flag, _overlay_settings.TARGET_ATTENTION_ARGS))
DRAFT_ATTENTION_FLAG = _flag(_overlay_settings.DRAFT_ATTENTION_ARG)
ATTENTION_FLAGS = (*TARGET_ATTENTION_FLAGS, DRAFT_ATTENTION_FLAG)


def _flag_values(cfg: InstanceConfig, flags) -> set[str]:
    """The values extraArgs gives these flags (``--flag value`` or ``--flag=value``)."""
    named, args = set(), cfg.extra_args
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in flags:
            named.add(value if eq else (args[i + 1] if i + 1 < len(args) else None))
    return {b for b in named if b}


def attention_backends(cfg: InstanceConfig) -> set[str]:
    """Every attention backend the server's flags name (typed options and extraArgs)."""
    named = {cfg.attention_backend, cfg.draft_attention_backend} | _flag_values(cfg,
                                                                               ATTENTION_FLAGS)
    return {b for b in named if b}


def draft_attention_is_flashinfer(cfg: InstanceConfig) -> bool:
    """Whether the drafter's forwards run FlashInfer attention (``settings.draft_is_flashinfer``
    over the target's flags and the drafter's own, typed option or extraArgs)."""
    draft = cfg.draft_attention_backend or next(iter(sorted(_flag_values(
        cfg, (DRAFT_ATTENTION_FLAG,)))), None)
    target = {cfg.attention_backend} | _flag_values(cfg, TARGET_ATTENTION_FLAGS)
    return _overlay_settings.draft_is_flashinfer({b for b in target if b}, draft)


def _check_ddtree_switches(cfg: InstanceConfig) -> None:
    """The DDTree switches the config's environment sets, judged as the launcher judges them
    (``settings.check_switches``), so a bad one fails the config check, not the service."""
    try:
        _overlay_settings.check_switches(dict(cfg.environment),
                                         "flashinfer" in attention_backends(cfg),
                                         draft_attention_is_flashinfer(cfg))
    except _overlay_settings.DDTreeConfigError as exc:
        raise ConfigError(f"environment: {exc}") from None


def _parse_extra_args(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        raise ConfigError("extraArgs: must be a list of strings")
    for a in raw:
        if "\0" in a:  # argv cannot carry NUL; Popen would raise
            raise ConfigError(f"extraArgs: {a!r} contains a NUL character")
        flag = _flag_of(a)
        owned = (*FORBIDDEN_EXTRA_ARGS, *TYPED_FLAGS)
        if len(flag) > 2 and flag not in owned and any(f.startswith(flag) for f in owned):
            # SGLang's argparse accepts unambiguous abbreviations: --api-k=x is --api-key=x.
            full = next(f for f in owned if f.startswith(flag))
            raise ConfigError(f"extraArgs: {flag} abbreviates {full}, which serve owns")
        if flag in SECRET_FLAGS:
            raise ConfigError(
                f"extraArgs: {flag} puts the key on the command line; use apiKeyFile instead"
            )
        if flag == "--config":
            raise ConfigError("extraArgs: --config is reserved for serve (it carries the API key)")
        if flag in TYPED_FLAGS:
            raise ConfigError(f"extraArgs: {flag} is rendered from a typed key; set that key")
    return tuple(raw)


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()


def parse_config(raw: Any) -> InstanceConfig:
    """Validate a decoded JSON object and return the config; pure (no I/O)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"config: must be a JSON object, got {type(raw).__name__}")
    if "apiKey" in raw:
        raise ConfigError("apiKey: inline API keys are refused; put the key in a file, apiKeyFile")
    unknown = sorted(set(raw) - set(KNOWN_KEYS))
    if unknown:
        raise ConfigError(unknown_key_message(unknown[0], KNOWN_KEYS))
    for key in ("name", "model"):
        if key not in raw:
            raise ConfigError(f"{key}: required key is missing")
    values: dict[str, Any] = {}
    for key, (types, nullable) in _SCALARS.items():
        if key in raw:
            _check_type(key, raw[key], types, nullable)
            values[_snake(key)] = raw[key]
            if isinstance(raw[key], str) and CONTROL_RE.search(raw[key]):
                raise ConfigError(f"{key}: must not contain control characters, got {raw[key]!r}")
    for key in FLAG_VALUE_KEYS:
        value = values.get(_snake(key))
        if isinstance(value, str) and value.startswith("-"):
            raise ConfigError(
                f"{key}: {value!r} starts with '-', which SGLang would read as a flag "
                "(write a local path as ./-name or an absolute path)"
            )

    if not NAME_RE.match(values["name"]):
        raise ConfigError(f"name: {values['name']!r} must match {NAME_RE.pattern}")
    if not values["model"].strip():
        raise ConfigError("model: must not be empty")
    algorithm = values.get("algorithm", "dflash")
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm: {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    if algorithm != "none" and not values.get("draft_model"):
        raise ConfigError(f"draftModel: algorithm {algorithm!r} needs a draft model")
    _in_range("port", values.get("port"), 1, 65535)
    _limit("blockSize", values.get("block_size"))
    _limit("contextLength", values.get("context_length"))
    _limit("maxRunningRequests", values.get("max_running_requests"))
    _limit("startTimeout", values.get("start_timeout"))
    mfs = values.get("mem_fraction_static")
    if mfs is not None and (not math.isfinite(mfs) or not 0 < mfs < 1):
        raise ConfigError(f"memFractionStatic: {mfs} must be in (0, 1)")
    if not values.get("host", "x").strip():
        raise ConfigError("host: must not be empty")
    check_key_file("apiKeyFile", values.get("api_key_file"))
    cache_dir = values.get("cache_dir")
    if cache_dir is not None and not cache_dir.startswith("/"):
        raise ConfigError(f"cacheDir: must be an absolute path, got {cache_dir!r}")

    values["ddtree"] = _parse_ddtree(raw.get("ddtree"))
    gpus = _parse_gpus(raw.get("gpus", [0]))
    values["gpus"] = gpus
    multi = _parse_multi_node(raw.get("multiNode"))
    nnodes = multi.nnodes if multi else 1
    tp = values.get("tensor_parallel_size")
    if tp is None:
        tp = max(len(gpus), 1) * nnodes
    _limit("tensorParallelSize", tp)
    if multi and tp % nnodes:
        raise ConfigError(f"tensorParallelSize: {tp} is not divisible by multiNode.nnodes = "
                          f"{nnodes} (each node runs tensorParallelSize / nnodes ranks)")
    if gpus and tp != len(gpus) * nnodes:
        per_node = f" x {nnodes} nodes" if multi else ""
        raise ConfigError(
            f"tensorParallelSize: {tp} does not match the {len(gpus)} GPU(s) in gpus "
            f"{list(gpus)}{per_node}"
        )
    values["tensor_parallel_size"] = tp
    values["multi_node"] = multi
    values["metrics_enable"] = _parse_metrics(raw.get("metrics"))
    values["environment"] = _parse_environment(raw.get("environment", {}))
    values["extra_args"] = _parse_extra_args(raw.get("extraArgs", []))
    cfg = InstanceConfig(**{**values, "offline": False})
    if cfg.algorithm == "ddtree":
        _check_ddtree_switches(cfg)
    offline = values.get("offline")
    if offline is None:
        offline = default_offline(cfg.models())
    elif offline:
        for key, model, rev in cfg.models():
            if not is_local_model(model) and not is_pinned(rev):
                got = f"{rev!r}, not a 40-hex commit" if rev is not None else "not set"
                raise ConfigError(f"{key}Revision: offline serving of hub id {model!r} needs "
                                  f"a pinned commit (40 hex digits), got {got}")
    return InstanceConfig(**{**values, "offline": offline})


def read_config_json(path: str | Path) -> Any:
    """The config file's JSON, unvalidated; every read or parse failure is a one-line ConfigError.

    Separate from `load_config` because the bench applies overrides to the raw document first.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: config is not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        where = f"line {e.lineno} column {e.colno}"
        raise ConfigError(f"{path}: not JSON: {e.msg} at {where}") from None


def load_config(path: str | Path) -> InstanceConfig:
    """Read and validate an instance config file; every failure is a one-line ConfigError
    that starts with the file's path, so the operator knows which file to edit."""
    raw = read_config_json(path)
    try:
        return parse_config(raw)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def render_argv(cfg: InstanceConfig) -> list[str]:
    """SGLang's argv after `-m sglang.launch_server`: typed keys first, extraArgs last."""
    argv = ["--model-path", cfg.model]
    if cfg.model_revision:
        argv += ["--revision", cfg.model_revision]
    argv += ["--host", cfg.host, "--port", str(cfg.port)]
    argv += ["--tp-size", str(cfg.tensor_parallel_size)]
    if cfg.multi_node is not None:
        mn = cfg.multi_node
        argv += ["--nnodes", str(mn.nnodes), "--node-rank", str(mn.node_rank),
                 "--dist-init-addr", mn.dist_init_addr]
    if cfg.metrics_enable:
        argv.append("--enable-metrics")
    optional = [
        ("--mem-fraction-static", cfg.mem_fraction_static),
        ("--attention-backend", cfg.attention_backend),
        ("--context-length", cfg.context_length),
        ("--max-running-requests", cfg.max_running_requests),
        ("--served-model-name", cfg.served_model_name),
        ("--load-format", cfg.load_format),
    ]
    argv += [x for flag, v in optional if v is not None for x in (flag, str(v))]
    if cfg.skip_tokenizer_init:
        argv.append("--skip-tokenizer-init")
    if cfg.speculative:
        # DDTree is a mode of DFLASH switched on by the budget env var (see render_env).
        argv += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
                 str(cfg.draft_model)]
        spec_optional = [
            ("--speculative-draft-model-revision", cfg.draft_model_revision),
            ("--speculative-dflash-block-size", cfg.block_size),
            ("--speculative-draft-load-format", cfg.draft_load_format),
            ("--speculative-draft-attention-backend", cfg.draft_attention_backend),
        ]
        argv += [x for flag, v in spec_optional if v is not None for x in (flag, str(v))]
    return argv + list(cfg.extra_args)


def cache_env(cache_dir: str) -> dict[str, str]:
    """Per-instance cache locations for every JIT and download cache SGLang touches.

    SGLang 0.5.17's own JIT kernels (sglang/kernels/jit, built through tvm-ffi) read
    TVM_FFI_CACHE_DIR, else the literal ~/.cache/tvm-ffi: without it they land in $HOME (the
    unit's state directory), not with the other compiled code.
    """
    return {
        "XDG_CACHE_HOME": cache_dir,
        "HF_HOME": f"{cache_dir}/huggingface",
        "TRITON_CACHE_DIR": f"{cache_dir}/triton",
        "FLASHINFER_WORKSPACE_BASE": f"{cache_dir}/flashinfer",
        "TORCHINDUCTOR_CACHE_DIR": f"{cache_dir}/inductor",
        "TVM_FFI_CACHE_DIR": f"{cache_dir}/tvm-ffi",
    }


def render_env(cfg: InstanceConfig) -> dict[str, str]:
    """Environment for the SGLang child, on top of the inherited one.

    Order of precedence: computed cache dirs < `environment` < GPU, DDTree and offline
    keys (those cannot be set through `environment`; parse_config refuses them).
    """
    env: dict[str, str] = cache_env(cfg.cache_dir) if cfg.cache_dir else {}
    env.update(dict(cfg.environment))
    if cfg.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in cfg.gpus)
    if cfg.algorithm == "ddtree":
        env[DDTREE_BUDGET_ENV] = str(cfg.ddtree.budget)
        if cfg.ddtree.policy != "fixed":
            env[DDTREE_POLICY_ENV] = cfg.ddtree.policy
    if cfg.offline:  # models are local or fetched ahead: SGLang must not reach the hub
        env[HF_OFFLINE_ENV] = "1"
    return env


def unset_env(cfg: InstanceConfig) -> tuple[str, ...]:
    """Inherited variables that must not reach the child (a stale DDTree switch or policy)."""
    if cfg.algorithm != "ddtree":
        return (DDTREE_BUDGET_ENV, DDTREE_POLICY_ENV)
    return () if cfg.ddtree.policy != "fixed" else (DDTREE_POLICY_ENV,)
