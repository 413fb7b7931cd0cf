"""`sglang-dflash router`: SGLang's router (smg, the model gateway) in front of instances.

A router config (JSON; keys = the NixOS module's `services.sglang-dflash.routers.<name>`
options) is validated here and rendered to smg's argv by `render_argv`, the one router
renderer, as `sglang_dflash.config` is for instances. Workers are `http(s)://host:port` URLs
or absolute paths of local instance configs (the module passes each instance's config file):
their URL comes from the instance's own host/port, so Nix never restates it.

The launcher starts `python -m sglang_dflash.router_child` (smg's `smg launch`, with the API
key read from a file instead of argv), tells systemd READY=1 once the router answers
/health, forwards SIGTERM/SIGINT and exits with the router's code. Pure functions first; I/O
only in `load_router_config`, `resolve_workers` and `supervise`.
"""

from __future__ import annotations

import re
import shlex
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_dflash import sdnotify
from sglang_dflash.config import (
    CONTROL_RE,
    LIMITS,
    NAME_RE,
    ConfigError,
    _check_type,
    _in_range,
    check_key_file,
    load_config,
    read_config_json,
    unknown_key_message,
)
from sglang_dflash.sglang_overlay import settings

POLICIES: tuple[str, ...] = tuple(LIMITS["routerPolicies"])
DEFAULT_PORT: int = LIMITS["routerDefaultPort"]
DEFAULT_METRICS_PORT: int = LIMITS["routerDefaultMetricsPort"]
DEFAULT_START_TIMEOUT = 300
DEFAULT_SHUTDOWN_GRACE = 25  # below the launcher's 30 s stop grace and the unit's TimeoutStopSec
LOG_LEVELS = ("debug", "info", "warn", "error")
KEY_FILE_ENV = settings.ROUTER_KEY_FILE_ENV
URL_RE = re.compile(r"^https?://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*):([0-9]{1,5})/?$")
# Flags rendered from typed keys, and the key flag that would put a secret into argv.
TYPED_FLAGS = (
    "--host", "--port", "--policy", "--worker-urls", "--prometheus-host", "--prometheus-port",
    "--shutdown-grace-period-secs", "--health-check-interval-secs", "--health-check-timeout-secs",
    "--health-failure-threshold", "--health-success-threshold", "--health-check-endpoint",
    "--retry-max-retries", "--retry-initial-backoff-ms", "--retry-max-backoff-ms",
    "--disable-retries", "--disable-circuit-breaker", "--request-timeout-secs",
    "--worker-startup-timeout-secs", "--log-level",
)
SECRET_FLAGS: tuple[str, ...] = tuple(LIMITS["secretFlags"]["router"])

# block -> key -> (flag, type, lo, hi); null (the default) leaves smg's own default.
_INT_MAX = 10**9
BLOCKS: dict[str, dict[str, tuple[str, type, int, int]]] = {
    "healthCheck": {
        "intervalSecs": ("--health-check-interval-secs", int, 1, 86400),
        "timeoutSecs": ("--health-check-timeout-secs", int, 1, 3600),
        "failureThreshold": ("--health-failure-threshold", int, 1, 1000),
        "successThreshold": ("--health-success-threshold", int, 1, 1000),
    },
    "retry": {
        "maxRetries": ("--retry-max-retries", int, 0, 100),
        "initialBackoffMs": ("--retry-initial-backoff-ms", int, 1, 3_600_000),
        "maxBackoffMs": ("--retry-max-backoff-ms", int, 1, 3_600_000),
    },
}
_SCALARS: dict[str, tuple[str | None, type, int, int]] = {
    "requestTimeoutSecs": ("--request-timeout-secs", int, 1, 604800),
    "workerStartupTimeoutSecs": ("--worker-startup-timeout-secs", int, 1, 604800),
}
# Worker health paths that are SGLang 0.5.17's health_generate handler (None: smg's default
# /health); it sleeps 1 s before answering 200, so a 1 s check timeout fails every worker.
SLOW_HEALTH = (None, "/health", "/health_generate")
KNOWN_KEYS = ("name", "workers", "policy", "host", "port", "healthCheck", "retry",
              "circuitBreaker", "requestTimeoutSecs", "workerStartupTimeoutSecs",
              "shutdownGraceSecs", "apiKeyFile", "metrics", "logLevel", "extraArgs",
              "startTimeout")


class RouterError(ValueError):
    """A router config that cannot run; one line naming the key."""


@dataclass(frozen=True)
class RouterConfig:
    name: str
    workers: tuple[str, ...]
    policy: str = "cache_aware"
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    health_check: tuple[tuple[str, int], ...] = ()
    health_check_endpoint: str | None = None
    retry: tuple[tuple[str, int], ...] = ()
    retry_enable: bool = True
    circuit_breaker_enable: bool = True
    timeouts: tuple[tuple[str, int], ...] = ()
    shutdown_grace_secs: int = DEFAULT_SHUTDOWN_GRACE
    api_key_file: str | None = None
    metrics_host: str | None = None
    metrics_port: int = DEFAULT_METRICS_PORT
    log_level: str | None = None
    extra_args: tuple[str, ...] = ()
    start_timeout: int = DEFAULT_START_TIMEOUT

    @property
    def prometheus_host(self) -> str:
        """smg binds 0.0.0.0 without --prometheus-host; ours follows the router's host."""
        return self.metrics_host or self.host


def is_instance_path(entry: str) -> bool:
    return entry.startswith("/")


def _int_in(key: str, value: Any, lo: int, hi: int, nullable: bool = True) -> int | None:
    _check_type(key, value, (int,), nullable)
    _in_range(key, value, lo, hi)
    return value


def _block(key: str, raw: Any, known: tuple[str, ...]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}: must be an object, got {raw!r}")
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"{key}.{unknown_key_message(unknown[0], known)}")
    return raw


def _parse_workers(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError("workers: must be a non-empty list of worker URLs "
                          "(http://host:port) or local instance config paths")
    for i, w in enumerate(raw):
        if not isinstance(w, str):
            raise ConfigError(f"workers[{i}]: must be a string, got {type(w).__name__}")
        if CONTROL_RE.search(w):
            raise ConfigError(f"workers[{i}]: must not contain control characters, got {w!r}")
        if is_instance_path(w):
            continue
        m = URL_RE.match(w)
        if not m or not 1 <= int(m.group(1)) <= 65535:
            raise ConfigError(f"workers[{i}]: {w!r} is neither http(s)://host:port nor an "
                              "absolute path of an instance config")
    if len(set(raw)) != len(raw):
        raise ConfigError(f"workers: lists a worker twice: {raw}")
    return tuple(raw)


def _flag_of(arg: str) -> str:
    return arg.split("=", 1)[0]


def _parse_extra_args(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        raise ConfigError("extraArgs: must be a list of strings")
    owned = (*TYPED_FLAGS, *SECRET_FLAGS)
    for a in raw:
        if "\0" in a:
            raise ConfigError(f"extraArgs: {a!r} contains a NUL character")
        flag = _flag_of(a)
        if flag in SECRET_FLAGS:
            raise ConfigError(f"extraArgs: {flag} puts a secret on the command line; "
                              "use apiKeyFile (or the router's own environment file)")
        if flag in TYPED_FLAGS:
            raise ConfigError(f"extraArgs: {flag} is rendered from a typed key; set that key")
        if len(flag) > 2 and flag not in owned and any(f.startswith(flag) for f in owned):
            full = next(f for f in owned if f.startswith(flag))  # argparse abbreviations
            raise ConfigError(f"extraArgs: {flag} abbreviates {full}, which the router "
                              "config owns")
    return tuple(raw)


def parse_router_config(raw: Any) -> RouterConfig:
    """Validate a decoded JSON object (pure); ConfigError with one line naming the key."""
    if not isinstance(raw, dict):
        raise ConfigError(f"router config: must be a JSON object, got {type(raw).__name__}")
    if "apiKey" in raw:
        raise ConfigError("apiKey: inline API keys are refused; put the key in a file, apiKeyFile")
    unknown = sorted(set(raw) - set(KNOWN_KEYS))
    if unknown:
        hint = ""
        if unknown[0] in ("model", "draftModel", "gpus", "algorithm"):
            hint = " (this is an instance key: is this an instance config, not a router's?)"
        raise ConfigError(unknown_key_message(unknown[0], KNOWN_KEYS) + hint)
    for key in ("name", "workers"):
        if key not in raw:
            raise ConfigError(f"{key}: required key is missing")
    v: dict[str, Any] = {}
    _check_type("name", raw["name"], (str,), False)
    if not NAME_RE.match(raw["name"]):
        raise ConfigError(f"name: {raw['name']!r} must match {NAME_RE.pattern}")
    v["name"] = raw["name"]
    v["workers"] = _parse_workers(raw["workers"])
    policy = raw.get("policy", "cache_aware")
    _check_type("policy", policy, (str,), False)
    if policy not in POLICIES:
        raise ConfigError(f"policy: {policy!r} is not one of {', '.join(POLICIES)}")
    v["policy"] = policy
    host = raw.get("host", "127.0.0.1")
    _check_type("host", host, (str,), False)
    if not host.strip() or host.startswith("-") or CONTROL_RE.search(host):
        raise ConfigError(f"host: {host!r} is not an address")
    v["host"] = host
    v["port"] = _int_in("port", raw.get("port", DEFAULT_PORT), 1, 65535, nullable=False)

    hc = _block("healthCheck", raw.get("healthCheck"), (*BLOCKS["healthCheck"], "endpoint"))
    v["health_check"] = _typed_block("healthCheck", hc, BLOCKS["healthCheck"])
    endpoint = hc.get("endpoint")
    _check_type("healthCheck.endpoint", endpoint, (str,), True)
    if endpoint is not None and (not endpoint.startswith("/") or CONTROL_RE.search(endpoint)
                                 or " " in endpoint):
        raise ConfigError(f"healthCheck.endpoint: {endpoint!r} must be a path like /health")
    v["health_check_endpoint"] = endpoint
    hc_timeout = dict(v["health_check"]).get("--health-check-timeout-secs")
    if hc_timeout is not None and hc_timeout < 2 and endpoint in SLOW_HEALTH:
        raise ConfigError(
            f"healthCheck.timeoutSecs: {hc_timeout} s is shorter than SGLang 0.5.17's "
            f"{endpoint or '/health'}, which answers a server that is up only after a one-token "
            "generation and a 1 s wait: every check would fail; use 2 or more")
    retry = _block("retry", raw.get("retry"), (*BLOCKS["retry"], "enable"))
    v["retry"] = _typed_block("retry", retry, BLOCKS["retry"])
    v["retry_enable"] = retry.get("enable", True)
    _check_type("retry.enable", v["retry_enable"], (bool,), False)
    cb = _block("circuitBreaker", raw.get("circuitBreaker"), ("enable",))
    v["circuit_breaker_enable"] = cb.get("enable", True)
    _check_type("circuitBreaker.enable", v["circuit_breaker_enable"], (bool,), False)
    v["timeouts"] = _typed_block(None, {k: raw.get(k) for k in _SCALARS}, _SCALARS)
    v["shutdown_grace_secs"] = _int_in("shutdownGraceSecs",
                                       raw.get("shutdownGraceSecs", DEFAULT_SHUTDOWN_GRACE),
                                       0, 3600, nullable=False)
    v["start_timeout"] = _int_in("startTimeout", raw.get("startTimeout", DEFAULT_START_TIMEOUT),
                                 LIMITS["startTimeout"]["min"], LIMITS["startTimeout"]["max"],
                                 nullable=False)
    key_file = raw.get("apiKeyFile")
    _check_type("apiKeyFile", key_file, (str,), True)
    check_key_file("apiKeyFile", key_file)
    v["api_key_file"] = key_file
    metrics = _block("metrics", raw.get("metrics"), ("host", "port"))
    mhost = metrics.get("host")
    _check_type("metrics.host", mhost, (str,), True)
    if mhost is not None and (not mhost.strip() or mhost.startswith("-")
                              or CONTROL_RE.search(mhost)):
        raise ConfigError(f"metrics.host: {mhost!r} is not an address")
    v["metrics_host"] = mhost
    v["metrics_port"] = _int_in("metrics.port", metrics.get("port", DEFAULT_METRICS_PORT),
                                1, 65535, nullable=False)
    if v["metrics_port"] == v["port"] and (mhost or host) == host:
        raise ConfigError(f"metrics.port: {v['metrics_port']} is the router's own port")
    level = raw.get("logLevel")
    _check_type("logLevel", level, (str,), True)
    if level is not None and level not in LOG_LEVELS:
        raise ConfigError(f"logLevel: {level!r} is not one of {', '.join(LOG_LEVELS)}")
    v["log_level"] = level
    v["extra_args"] = _parse_extra_args(raw.get("extraArgs", []))
    return RouterConfig(**v)


def _typed_block(prefix: str | None, raw: dict[str, Any],
                 spec: dict[str, tuple[str | None, type, int, int]]) -> tuple[tuple[str, int], ...]:
    out = []
    for key, (flag, _t, lo, hi) in spec.items():
        name = f"{prefix}.{key}" if prefix else key
        value = _int_in(name, raw.get(key), lo, hi)
        if value is not None and flag is not None:
            out.append((flag, value))
    return tuple(out)


def load_router_config(path: str | Path) -> RouterConfig:
    """Read and validate a router config; every failure is one line starting with the path."""
    raw = read_config_json(path)
    try:
        return parse_router_config(raw)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


@dataclass(frozen=True)
class Worker:
    url: str
    instance: str | None = None  # the local instance's name (its unit) when from a config
    needs_key: bool = False


def resolve_workers(cfg: RouterConfig) -> list[Worker]:
    """URLs as given; instance config paths read, validated and turned into their URL."""
    from sglang_dflash.check.instance import config_url

    out = []
    for i, w in enumerate(cfg.workers):
        if not is_instance_path(w):
            out.append(Worker(w.rstrip("/")))
            continue
        try:
            inst = load_config(w)
        except ConfigError as e:
            raise ConfigError(f"workers[{i}]: {e}") from None
        if inst.multi_node is not None and inst.multi_node.node_rank != 0:
            raise ConfigError(f"workers[{i}]: instance {inst.name!r} is node rank "
                              f"{inst.multi_node.node_rank} of a multi-node group; only rank 0 "
                              "serves HTTP, route to that one")
        if inst.api_key_file is not None and cfg.api_key_file is None:
            raise ConfigError(f"workers[{i}]: instance {inst.name!r} requires an API key; set "
                              "the router's apiKeyFile (smg sends one key to its workers and "
                              "asks it of its clients)")
        out.append(Worker(config_url(inst), inst.name, inst.api_key_file is not None))
    urls = [x.url for x in out]
    if len(set(urls)) != len(urls):
        raise ConfigError(f"workers: two entries reach the same server: {urls}")
    return out


def render_argv(cfg: RouterConfig, urls: list[str]) -> list[str]:
    """smg's argv (`smg launch ...`, smg.launch_router's parser): typed keys, extraArgs last."""
    argv = ["--host", cfg.host, "--port", str(cfg.port), "--policy", cfg.policy,
            "--prometheus-host", cfg.prometheus_host, "--prometheus-port", str(cfg.metrics_port),
            "--shutdown-grace-period-secs", str(cfg.shutdown_grace_secs)]
    for flag, value in (*cfg.health_check, *cfg.retry, *cfg.timeouts):
        argv += [flag, str(value)]
    if cfg.health_check_endpoint is not None:
        argv += ["--health-check-endpoint", cfg.health_check_endpoint]
    if not cfg.retry_enable:
        argv.append("--disable-retries")
    if not cfg.circuit_breaker_enable:
        argv.append("--disable-circuit-breaker")
    if cfg.log_level is not None:
        argv += ["--log-level", cfg.log_level]
    argv += ["--worker-urls", *urls]
    return argv + list(cfg.extra_args)


def child_command(cfg: RouterConfig, urls: list[str], python: str = sys.executable) -> list[str]:
    return [python, "-m", "sglang_dflash.router_child", *render_argv(cfg, urls)]


def key_source(cfg: RouterConfig, environ: dict[str, str]) -> str | None:
    """The file the child reads its key from: systemd's credential, else apiKeyFile."""
    if cfg.api_key_file is None:
        return None
    cred = environ.get("CREDENTIALS_DIRECTORY")
    if cred and (Path(cred) / "api-key").is_file():
        return str(Path(cred) / "api-key")
    return cfg.api_key_file


def render_print(cfg: RouterConfig, urls: list[str], environ: dict[str, str],
                 python: str = sys.executable) -> str:
    words = ["env"]
    src = key_source(cfg, environ)
    if src is not None:
        words.append(f"{KEY_FILE_ENV}={src}")
    return shlex.join(words + child_command(cfg, urls, python))


# ---- the launcher ---------------------------------------------------------------------------


def _err(msg: str) -> None:
    print(f"sglang-dflash router: {msg}", file=sys.stderr, flush=True)


def supervise(cfg: RouterConfig, urls: list[str], interval: float, environ: dict[str, str],
              grace: float) -> int:
    """Start smg, READY=1 once it answers /health, forward stop signals, exit with its code."""
    from sglang_dflash.apikey import read_api_key
    from sglang_dflash.serve import Supervisor, _report_death, exit_code, port_in_use

    read_api_key(cfg, environ)  # a missing or empty key file fails here, in one line
    env = dict(environ)
    env.pop(KEY_FILE_ENV, None)
    src = key_source(cfg, environ)
    if src is not None:
        env[KEY_FILE_ENV] = src
    where = f"{cfg.host}:{cfg.port}"
    for host, port, what in ((cfg.host, cfg.port, "the router"),
                             (cfg.prometheus_host, cfg.metrics_port, "its metrics")):
        if port_in_use(host, port):
            _err(f"something already listens on {host}:{port} ({what}); another router?")
            return 1
    pending: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _f: pending.append(signum))
                for s in (signal.SIGTERM, signal.SIGINT)}
    sup = None
    try:
        argv = child_command(cfg, urls)
        try:
            sup = Supervisor(cfg, argv, env, grace)  # polls cfg.host:cfg.port/health
        except (OSError, ValueError) as e:
            _err(f"cannot start {argv[0]}: {getattr(e, 'strerror', None) or e}")
            return 1
        for s in previous:
            signal.signal(s, sup.forward)
        if pending:
            sup.forward(pending[0])
        sdnotify.notify(f"STATUS=starting the router on {where}", environ)
        started = time.monotonic()
        ready = sup.wait_ready(interval, cfg.start_timeout)
        if ready is False:
            if sup.signalled is not None:
                return sup.stopped()
            _report_death(sup, "before it was ready")
            return exit_code(sup.proc.returncode) or 1
        if ready is None and sup.signalled is not None:
            sup.kill()
            sup.proc.wait()
            return sup.stopped()
        if ready is None:
            _err(f"the router did not answer /health on {where} within startTimeout="
                 f"{cfg.start_timeout}s; stopping it")
            sup.stop()
            _report_death(sup, "after the start timeout")
            return 1
        status = f"routing ({cfg.policy}) over {len(urls)} worker(s) on {where}"
        if sup.signalled is None:
            sdnotify.notify(f"READY=1\nSTATUS={status}", environ)
            _err(f"ready after {time.monotonic() - started:.1f}s: {status}")
        code = sup.wait_exit()
        if sup.signalled is None:
            _report_death(sup, "after it was ready")
            return exit_code(code) or 1
        return sup.stopped()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if sup is not None and sup.proc.poll() is None:
            sup.stop()


# ---- the unit for hosts that are not NixOS (`sglang-dflash unit --router`) ------------------


def router_directives(shared: dict[str, Any]) -> list[dict[str, Any]]:
    """The instances' hardening with routerHardening's entries replacing theirs (no GPU)."""
    override = {e["key"]: e for e in shared.get("routerHardening", [])}
    merged = [override.get(e["key"], e) for e in shared["hardening"]]
    have = {e["key"] for e in shared["hardening"]}
    return merged + [e for k, e in override.items() if k not in have]


def unit_name(cfg: RouterConfig) -> str:
    return f"sglang-dflash-router-{cfg.name}.service"


def render_unit(cfg: RouterConfig, workers: list[Worker], config_path: str, opts) -> str:
    """The router's unit text (pure but for the hardening file); UnitError for unsafe values."""
    from sglang_dflash.unit import (
        UnitError,
        directive_lines,
        env_line,
        exec_line,
        load_hardening,
        sandbox_hidden,
        spec_escape,
    )

    shared = load_hardening()
    for name, value in (("--config", config_path), ("--package-path", opts.package_path),
                        ("--environment-file", opts.environment_file),
                        ("apiKeyFile", cfg.api_key_file)):
        if value is not None and CONTROL_RE.search(value):
            raise UnitError(f"{name}: must not contain control characters, got {value!r}")
    for name, value in (("--config", config_path), ("--package-path", opts.package_path),
                        *((f"workers[{i}]", w) for i, w in enumerate(cfg.workers)
                          if is_instance_path(w))):
        hidden = sandbox_hidden(value, shared)
        if hidden is not None:
            raise UnitError(f"{name}: {value} is hidden from the service by {hidden}=true; "
                            "move it (e.g. under /srv or /etc) or the unit can never start")
    exe = f"{opts.package_path.rstrip('/')}/bin/sglang-dflash"
    sub = f"sglang-dflash-router-{cfg.name}"
    local = [f"sglang-dflash-{w.instance}.service" for w in workers if w.instance]
    after = " ".join(["network-online.target", *local])
    lines = [
        f"# {unit_name(cfg)}: rendered by `sglang-dflash unit --router` from {config_path}",
        "# Directives and their reasons: sglang_dflash/unit-hardening.json (routerHardening",
        "# replaces the GPU entries). Re-render instead of editing by hand.",
        "[Unit]",
        f"Description=SGLang router (smg) {cfg.name}: {cfg.policy} over {len(workers)} worker(s)",
        f"After={after}",
        f"Wants={after}",
        *directive_lines(shared["unit"]),
        "",
        "[Service]",
        *directive_lines(shared["lifecycle"]),
        f"TimeoutStartSec={cfg.start_timeout + LIMITS['startTimeoutMarginS']}s",
    ]
    if opts.user is None:
        lines.append("DynamicUser=true")
    else:
        lines += [f"User={opts.user}", f"Group={opts.group or opts.user}"]
    lines += [
        f"StateDirectory={sub}", f"RuntimeDirectory={sub}",
        "StateDirectoryMode=0700", "RuntimeDirectoryMode=0700",
        f"WorkingDirectory=%S/{sub}",
        env_line("HOME", f"%S/{sub}"),
        env_line("PYTHONUNBUFFERED", "1"),
    ]
    if opts.environment_file:
        lines.append(f"EnvironmentFile={spec_escape(opts.environment_file)}")
    if cfg.api_key_file:
        lines.append(f"LoadCredential=api-key:{spec_escape(cfg.api_key_file)}")
    lines.append("ExecStart=" + exec_line([exe, "router", "--config", config_path]))
    lines += directive_lines(router_directives(shared))
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)
