"""`sglang-dflash unit`: the NixOS module's hardened unit, for hosts that are not NixOS.

The seeds' hosts ran Ubuntu and wrote units by hand. This renders the same unit the module
renders (the directives come from unit-hardening.json, which the module reads too). The unit
runs `<package path>/bin/sglang-dflash`; the package path defaults to the environment this
command runs from (the interpreter's prefix: a venv from `uv sync`, or a Nix profile such as
`nix profile install --profile /nix/var/nix/profiles/sglang-dflash .#sglang-dflash`), and
`--package-path` names another.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sglang_dflash.config import START_TIMEOUT_MARGIN_S, ConfigError, InstanceConfig, load_config

NIX_PROFILE_PATH = "/nix/var/nix/profiles/sglang-dflash"  # the documented `nix profile` spot
DEFAULT_DRIVER_LIB = "/run/opengl-driver/lib"
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
# A user or group name (or numeric id) systemd accepts; anything else is a typo or an injection.
ACCOUNT_RE = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]+)$")


class UnitError(ValueError):
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE",
                        help="instance config (JSON); the unit refers to its absolute path")
    parser.add_argument("--package-path", "--prefix", dest="package_path", default=None,
                        metavar="DIR",
                        help="environment holding bin/sglang-dflash: a venv, a Nix profile "
                        f"(e.g. {NIX_PROFILE_PATH}) or store path (default: the one this "
                        "command runs from, sys.prefix)")
    parser.add_argument("--driver-lib-dir", default=DEFAULT_DRIVER_LIB, metavar="DIR",
                        help="directory with the host's libcuda.so.1 and NVIDIA libraries "
                        f"(default {DEFAULT_DRIVER_LIB}; see docs/service.md)")
    parser.add_argument("--environment-file", metavar="FILE",
                        help="EnvironmentFile= for secrets such as HF_TOKEN")
    parser.add_argument("--user", help="static user (default: DynamicUser)")
    parser.add_argument("--group", help="static group (default: the user's name)")
    parser.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    parser.add_argument("--router", action="store_true",
                        help="--config is a router config: render the router's unit "
                        "(sglang-dflash-router-<name>.service; docs/router.md)")


def _bad(msg: str) -> int:
    print(f"sglang-dflash unit: {msg}", file=sys.stderr)
    return 2


def default_package_path(prefix: str = sys.prefix) -> str:
    """The environment this command runs from: its bin/ holds the sglang-dflash it would run."""
    return os.path.abspath(prefix)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "router", False):
        return run_router(args)
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        return _bad(f"invalid config: {e}")
    if args.package_path is None:
        args.package_path = default_package_path()
        print(f"sglang-dflash unit: note: the unit runs {args.package_path}/bin/sglang-dflash "
              "(this command's environment; --package-path names another)", file=sys.stderr)
    for flag, value in (("--package-path", args.package_path),
                        ("--driver-lib-dir", args.driver_lib_dir),
                        ("--environment-file", args.environment_file)):
        if value is not None and not value.startswith("/"):
            return _bad(f"{flag}: must be an absolute path, got {value!r}")
    if args.group and not args.user:
        return _bad("--group needs --user (DynamicUser picks both)")
    opts = UnitOptions(args.package_path, args.driver_lib_dir, args.environment_file,
                       args.user, args.group)
    try:
        text = render_unit(cfg, os.path.abspath(args.config), opts)
    except UnitError as e:
        return _bad(str(e))
    if not Path(opts.package_path, "bin", "sglang-dflash").exists():
        print(f"sglang-dflash unit: note: {opts.package_path}/bin/sglang-dflash does not exist "
              "on this machine yet", file=sys.stderr)
    if cfg.api_key_file and not Path(cfg.api_key_file).is_file():
        print(f"sglang-dflash unit: note: apiKeyFile {cfg.api_key_file} does not exist yet; "
              "systemd's LoadCredential= fails the start until it does", file=sys.stderr)
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as e:
            return _bad(f"--output: cannot write {args.output}: {e.strerror or e}")
    else:
        sys.stdout.write(text)
    return 0


def run_router(args: argparse.Namespace) -> int:
    """`unit --router --config FILE`: the router's unit, same options and checks."""
    from sglang_dflash import router

    try:
        cfg = router.load_router_config(args.config)
        workers = router.resolve_workers(cfg)
    except ConfigError as e:
        return _bad(f"invalid config: {e}")
    if args.package_path is None:
        args.package_path = default_package_path()
    for flag, value in (("--package-path", args.package_path),
                        ("--environment-file", args.environment_file)):
        if value is not None and not value.startswith("/"):
            return _bad(f"{flag}: must be an absolute path, got {value!r}")
    if args.group and not args.user:
        return _bad("--group needs --user (DynamicUser picks both)")
    for name, value in (("--user", args.user), ("--group", args.group)):
        if value is not None and not ACCOUNT_RE.match(value):
            return _bad(f"{name}: {value!r} is not a user/group name or numeric id")
    opts = UnitOptions(args.package_path, args.driver_lib_dir, args.environment_file,
                       args.user, args.group)
    try:
        text = router.render_unit(cfg, workers, os.path.abspath(args.config), opts)
    except UnitError as e:
        return _bad(str(e))
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as e:
            return _bad(f"--output: cannot write {args.output}: {e.strerror or e}")
    else:
        sys.stdout.write(text)
    return 0
