"""The NixOS module's hardened unit, rendered for hosts that are not NixOS (`sglang-dflash unit`).

For systemd hosts such as Ubuntu or Debian: the same unit the module renders (the directives
come from unit-hardening.json, which the module reads too). The unit runs
`<package path>/bin/sglang-dflash`; the package path defaults to the environment this
command runs from (the interpreter's prefix: a venv from `uv sync`, or a Nix profile such as
`nix profile install --profile /nix/var/nix/profiles/sglang-dflash .#sglang-dflash`), and
`--package-path` names another.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from importlib import resources
from typing import Any

from sglang_dflash.config import START_TIMEOUT_MARGIN_S, InstanceConfig
from sglang_dflash.errors import UserError

NIX_PROFILE_PATH = "/nix/var/nix/profiles/sglang-dflash"  # the documented `nix profile` spot
DEFAULT_DRIVER_LIB = "/run/opengl-driver/lib"
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
# A user or group name (or numeric id) systemd accepts; anything else is a typo or an injection.
ACCOUNT_RE = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]+)$")


class UnitError(UserError, ValueError):
    """A value that cannot be written into a unit file safely; one line naming the option."""


@dataclass(frozen=True)
class UnitOptions:
    """Host-specific choices that are not part of the instance config."""

    package_path: str = NIX_PROFILE_PATH
    driver_lib_dir: str = DEFAULT_DRIVER_LIB
    environment_file: str | None = None
    user: str | None = None
    group: str | None = None
    fetch_models: bool = True  # an offline hub model: Requires= the loader unit


def load_hardening() -> dict[str, Any]:
    """The shared directives (unit-hardening.json, shipped inside the package)."""
    text = resources.files("sglang_dflash").joinpath("unit-hardening.json").read_text("utf-8")
    return json.loads(text)


def directive_value(value: Any) -> list[str]:
    """systemd's spelling of a JSON value: booleans true/false, a list = one line each."""
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)]


def directive_lines(entries: list[dict[str, Any]]) -> list[str]:
    return [f"{e['key']}={v}" for e in entries for v in directive_value(e["value"])]


def quote_exec_arg(arg: str, executable: bool = False) -> str:
    """Quote one word for ExecStart= (systemd.service(5) "Command lines"): % and $ escaped.

    systemd expands $VAR (and unescapes $$) in the arguments only, never in the executable
    name, so there a $ stays as it is.
    """
    escaped = arg.replace("%", "%%")
    if not executable:
        escaped = escaped.replace("$", "$$")
    if escaped and not any(c in escaped for c in ' \t\n"\'\\;'):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def exec_line(argv: list[str]) -> str:
    """A whole ExecStart= value: the executable, then its arguments."""
    return " ".join([quote_exec_arg(argv[0], executable=True),
                     *(quote_exec_arg(a) for a in argv[1:])])


def spec_escape(value: str) -> str:
    """A literal for directives that expand systemd specifiers (%n, %S, ...): % becomes %%."""
    return value.replace("%", "%%")


def sandbox_hidden(path: str, hardening: dict[str, Any]) -> str | None:
    """The directive under which ``path`` is invisible (or empty) to the service, or None.

    The table is ``sandboxHides`` in unit-hardening.json.
    """
    on = {e["key"] for e in hardening["hardening"] if e["value"] is True}
    norm = os.path.normpath(path)
    for key, roots in hardening["sandboxHides"].items():
        if key.startswith("_"):
            continue
        if key in on and any(norm == r or norm.startswith(r + "/") for r in roots):
            return key
    return None


def _refuse_hidden(paths: dict[str, str | None], hardening: dict[str, Any]) -> None:
    for name, value in paths.items():
        if value is None or not value.startswith("/"):
            continue  # unset, or a Hugging Face id
        key = sandbox_hidden(value, hardening)
        if key is not None:
            raise UnitError(f"{name}: {value} is hidden from the service by {key}=true; move it "
                            "(e.g. under /srv or /var/lib) or the unit can never start")


def check_instance_sandbox(cfg: InstanceConfig, hardening: dict[str, Any] | None = None) -> None:
    """Refuse an instance whose models or cache its hardened unit hides from it (the NixOS
    module's build-time check runs this through `serve --print-argv --sandboxed`)."""
    _refuse_hidden({"model": cfg.model, "draftModel": cfg.draft_model,
                    "cacheDir": cfg.cache_dir}, hardening or load_hardening())


def check_sandbox_paths(
    cfg: InstanceConfig, config_path: str, opts: UnitOptions, hardening: dict[str, Any]
) -> None:
    """Refuse files the service must read that its own sandbox hides: such a unit can never
    start (seen under a real systemd: a config in /tmp is not there for a PrivateTmp service).
    EnvironmentFile= and the API key (LoadCredential=) are read by systemd itself, before the
    sandbox, so they may live anywhere."""
    _refuse_hidden({"--config": config_path, "--package-path": opts.package_path,
                    "--driver-lib-dir": opts.driver_lib_dir}, hardening)
    check_instance_sandbox(cfg, hardening)


def check_unit_values(cfg: InstanceConfig, config_path: str, opts: UnitOptions) -> None:
    """Refuse what a unit line cannot hold: a newline would start a new directive."""
    values = {"--config": config_path, "--package-path": opts.package_path,
              "--driver-lib-dir": opts.driver_lib_dir,
              "--environment-file": opts.environment_file, "apiKeyFile": cfg.api_key_file}
    for name, value in values.items():
        if value is not None and CONTROL_RE.search(value):
            raise UnitError(f"{name}: must not contain control characters, got {value!r}")
    if any(c in opts.package_path for c in "\"'\\"):
        # systemd refuses such an executable name ("contains special characters")
        raise UnitError(f"--package-path: systemd cannot run an executable whose path holds "
                        f"a quote or backslash, got {opts.package_path!r}")
    for name, value in (("--user", opts.user), ("--group", opts.group)):
        if value is not None and not ACCOUNT_RE.match(value):
            raise UnitError(f"{name}: {value!r} is not a user/group name or numeric id")


def env_line(key: str, value: str) -> str:
    """One Environment= line, quoted; % is left alone so %S and friends expand."""
    body = f"{key}={value}".replace("\\", "\\\\").replace('"', '\\"')
    return f'Environment="{body}"'


def unit_name(cfg: InstanceConfig) -> str:
    return f"sglang-dflash-{cfg.name}.service"


def models_unit_name(cfg: InstanceConfig) -> str:
    """The model loader that runs `fetch-models` before the server (offline hub models)."""
    return f"sglang-dflash-{cfg.name}-models.service"


def merged_directives(base: list[dict[str, Any]], override: list[dict[str, Any]]
                      ) -> list[dict[str, Any]]:
    """`base` with `override`'s entries replacing those of the same key (new keys last)."""
    by_key = {e["key"]: e for e in override}
    have = {e["key"] for e in base}
    return [by_key.get(e["key"], e) for e in base] + [e for e in override
                                                       if e["key"] not in have]


def _identity_lines(cfg: InstanceConfig, opts: UnitOptions, loader: bool = False) -> list[str]:
    """User, the per-instance directories and HOME (server and loader share them: the loader
    fills the cache the server reads). The loader's DynamicUser is named after the server's
    (User=sglang-dflash-<name>), so both get the same user and the cache keeps its owner; the
    loader has no RuntimeDirectory
    (systemd removes it when a unit stops, and the server's lives in it)."""
    sub = f"sglang-dflash-{cfg.name}"  # one flat directory per instance, no shared parent
    if opts.user is None:
        lines = ["DynamicUser=true"] + ([f"User={sub}"] if loader else [])
    else:
        lines = [f"User={opts.user}", f"Group={opts.group or opts.user}"]
    lines += [
        f"StateDirectory={sub}",
        f"CacheDirectory={sub}",
        *([] if loader else [f"RuntimeDirectory={sub}"]),
        "StateDirectoryMode=0700",
        "CacheDirectoryMode=0700",
        *([] if loader else ["RuntimeDirectoryMode=0700"]),
        f"WorkingDirectory=%S/{sub}",
        env_line("HOME", f"%S/{sub}"),
    ]
    return lines


def _checked(cfg: InstanceConfig, config_path: str, opts: UnitOptions) -> dict[str, Any]:
    check_unit_values(cfg, config_path, opts)
    shared = load_hardening()
    check_sandbox_paths(cfg, config_path, opts, shared)
    return shared


def _exe(opts: UnitOptions) -> str:
    return f"{opts.package_path.rstrip('/')}/bin/sglang-dflash"


def render_unit(cfg: InstanceConfig, config_path: str, opts: UnitOptions) -> str:
    """The complete unit file text for one instance (pure); UnitError for unsafe values.

    An offline instance with a hub model (models.needs_loader) Requires= and is After= its
    model loader unit (render_models_unit) unless opts.fetch_models is False.
    """
    from sglang_dflash.models import needs_loader

    shared = _checked(cfg, config_path, opts)
    exe = _exe(opts)
    loader = [models_unit_name(cfg)] if opts.fetch_models and needs_loader(cfg) else []
    lines = [
        f"# {unit_name(cfg)}: rendered by `sglang-dflash unit` from {config_path}",
        "# Directives and their reasons: sglang_dflash/unit-hardening.json (shared with the",
        "# NixOS module services.sglang-dflash). Re-render instead of editing by hand.",
        "[Unit]",
        f"Description=SGLang DFlash/DDTree server {cfg.name} ({cfg.algorithm})",
        " ".join(["After=network-online.target nvidia-persistenced.service", *loader]),
        "Wants=network-online.target",
        *[f"Requires={u}" for u in loader],
        *directive_lines(shared["unit"]),
        "",
        "[Service]",
        *directive_lines(shared["lifecycle"]),
        f"TimeoutStartSec={cfg.start_timeout + START_TIMEOUT_MARGIN_S}s",
        *_identity_lines(cfg, opts),
        env_line("LD_LIBRARY_PATH", spec_escape(opts.driver_lib_dir)),
        env_line("TRITON_LIBCUDA_PATH", spec_escape(opts.driver_lib_dir)),
        env_line("PYTHONUNBUFFERED", "1"),
    ]
    if opts.environment_file:
        lines.append(f"EnvironmentFile={spec_escape(opts.environment_file)}")
    if cfg.api_key_file:
        lines.append(f"LoadCredential=api-key:{spec_escape(cfg.api_key_file)}")
    if cfg.preflight:  # the same preflight as the NixOS module's
        check = [exe, "check", "--offline", "--config", config_path]
        lines.append("ExecStartPre=" + exec_line(check))
    serve = [exe, "serve", "--config", config_path]
    lines.append("ExecStart=" + exec_line(serve))
    lines += directive_lines(shared["hardening"])
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


def render_models_unit(cfg: InstanceConfig, config_path: str, opts: UnitOptions) -> str:
    """The model loader unit: a oneshot running `fetch-models` into the server's cache, with
    the server's user, directories and hardening (no GPU devices; the network allowed).
    UnitError when the instance has nothing to fetch ahead."""
    from sglang_dflash.models import needs_loader

    if not needs_loader(cfg):
        raise UnitError(f"{config_path}: instance {cfg.name} has no model to fetch ahead (its "
                        "models are local directories, or it is not offline: pin each hub "
                        "model's revision to a commit)")
    shared = _checked(cfg, config_path, opts)
    fetch = [_exe(opts), "fetch-models", "--config", config_path]
    lines = [
        f"# {models_unit_name(cfg)}: rendered by `sglang-dflash unit --models` from "
        f"{config_path}",
        "# Directives and their reasons: sglang_dflash/unit-hardening.json (modelsUnit,",
        "# modelsLifecycle, modelsHardening). Re-render instead of editing by hand.",
        "[Unit]",
        f"Description=SGLang DFlash/DDTree models of {cfg.name} (fetched before the server)",
        "After=network-online.target",
        "Wants=network-online.target",
        f"Before={unit_name(cfg)}",
        *directive_lines(shared["modelsUnit"]),
        "",
        "[Service]",
        *directive_lines(shared["modelsLifecycle"]),
        *_identity_lines(cfg, opts, loader=True),
        env_line("PYTHONUNBUFFERED", "1"),
    ]
    if opts.environment_file:  # HF_TOKEN for gated models
        lines.append(f"EnvironmentFile={spec_escape(opts.environment_file)}")
    lines.append("ExecStart=" + exec_line(fetch))
    lines += directive_lines(merged_directives(shared["hardening"], shared["modelsHardening"]))
    lines += ["", "[Install]", f"WantedBy={unit_name(cfg)}", ""]
    return "\n".join(lines)


def default_package_path(prefix: str = sys.prefix) -> str:
    """The environment this command runs from: its bin/ holds the sglang-dflash it would run."""
    return os.path.abspath(prefix)
