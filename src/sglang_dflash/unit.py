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

    The table is ``sandboxHides`` in unit-hardening.json (the NixOS module asserts on it too).
    """
    on = {e["key"] for e in hardening["hardening"] if e["value"] is True}
    norm = os.path.normpath(path)
    for key, roots in hardening["sandboxHides"].items():
        if key.startswith("_"):
            continue
        if key in on and any(norm == r or norm.startswith(r + "/") for r in roots):
            return key
    return None


def check_sandbox_paths(
    cfg: InstanceConfig, config_path: str, opts: UnitOptions, hardening: dict[str, Any]
) -> None:
    """Refuse files the service must read that its own sandbox hides: such a unit can never
    start (seen under a real systemd: a config in /tmp is not there for a PrivateTmp service).
    EnvironmentFile= and the API key (LoadCredential=) are read by systemd itself, before the
    sandbox, so they may live anywhere."""
    paths = {"--config": config_path, "--package-path": opts.package_path,
             "--driver-lib-dir": opts.driver_lib_dir,
             "model": cfg.model, "draftModel": cfg.draft_model, "cacheDir": cfg.cache_dir}
    for name, value in paths.items():
        if value is None or not value.startswith("/"):
            continue  # unset, or a Hugging Face id
        key = sandbox_hidden(value, hardening)
        if key is not None:
            raise UnitError(f"{name}: {value} is hidden from the service by {key}=true; move it "
                            "(e.g. under /srv or /var/lib) or the unit can never start")


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


def render_unit(cfg: InstanceConfig, config_path: str, opts: UnitOptions) -> str:
    """The complete unit file text for one instance (pure); UnitError for unsafe values."""
    check_unit_values(cfg, config_path, opts)
    shared = load_hardening()
    check_sandbox_paths(cfg, config_path, opts, shared)
    exe = f"{opts.package_path.rstrip('/')}/bin/sglang-dflash"
    sub = f"sglang-dflash-{cfg.name}"  # one flat directory per instance, no shared parent
    lines = [
        f"# {unit_name(cfg)}: rendered by `sglang-dflash unit` from {config_path}",
        "# Directives and their reasons: sglang_dflash/unit-hardening.json (shared with the",
        "# NixOS module services.sglang-dflash). Re-render instead of editing by hand.",
        "[Unit]",
        f"Description=SGLang DFlash/DDTree server {cfg.name} ({cfg.algorithm})",
        "After=network-online.target nvidia-persistenced.service",
        "Wants=network-online.target",
        *directive_lines(shared["unit"]),
        "",
        "[Service]",
        *directive_lines(shared["lifecycle"]),
        f"TimeoutStartSec={cfg.start_timeout + START_TIMEOUT_MARGIN_S}s",
    ]
    if opts.user is None:
        lines.append("DynamicUser=true")
    else:
        lines += [f"User={opts.user}", f"Group={opts.group or opts.user}"]
    lines += [
        f"StateDirectory={sub}",
        f"CacheDirectory={sub}",
        f"RuntimeDirectory={sub}",
        "StateDirectoryMode=0700",
        "CacheDirectoryMode=0700",
        "RuntimeDirectoryMode=0700",
        f"WorkingDirectory=%S/{sub}",
        env_line("HOME", f"%S/{sub}"),
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


def default_package_path(prefix: str = sys.prefix) -> str:
    """The environment this command runs from: its bin/ holds the sglang-dflash it would run."""
    return os.path.abspath(prefix)
