"""`sglang-dflash unit`: print (or write) the hardened systemd unit for a non-NixOS host.

The unit itself is rendered by `sglang_dflash.unit`; this module reads the flags, picks the
package path (default: the environment this command runs from) and says what the unit will
need on this machine.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sglang_dflash.config import ConfigError, load_config
from sglang_dflash.errors import UserError
from sglang_dflash.unit import (
    ACCOUNT_RE,
    DEFAULT_DRIVER_LIB,
    NIX_PROFILE_PATH,
    UnitOptions,
    default_package_path,
    render_models_unit,
    render_unit,
)


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
    parser.add_argument("--models", action="store_true",
                        help="render the instance's model loader unit instead "
                        "(sglang-dflash-<name>-models.service: fetch-models before the server; "
                        "docs/service.md \"Models offline\")")
    parser.add_argument("--no-fetch-models", dest="fetch_models", action="store_false",
                        help="the server unit does not require the model loader unit (the "
                        "cache is filled another way)")
    parser.add_argument("--router", action="store_true",
                        help="--config is a router config: render the router's unit "
                        "(sglang-dflash-router-<name>.service; docs/router.md)")


def _write(text: str, output: str | None) -> None:
    if output:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as e:
            raise UserError(f"--output: cannot write {output}: {e.strerror or e}") from None
    else:
        sys.stdout.write(text)


def _check_paths(args: argparse.Namespace, flags: tuple[str, ...]) -> None:
    for flag in flags:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None and not value.startswith("/"):
            raise UserError(f"{flag}: must be an absolute path, got {value!r}")
    if args.group and not args.user:
        raise UserError("--group needs --user (DynamicUser picks both)")


def run_router(args: argparse.Namespace) -> int:
    """`unit --router --config FILE`: the router's unit, same options and checks."""
    from sglang_dflash import router

    try:
        cfg = router.load_router_config(args.config)
        workers = router.resolve_workers(cfg)
    except ConfigError as e:
        raise UserError(f"invalid config: {e}") from None
    if args.package_path is None:
        args.package_path = default_package_path()
    _check_paths(args, ("--package-path", "--environment-file"))
    for name, value in (("--user", args.user), ("--group", args.group)):
        if value is not None and not ACCOUNT_RE.match(value):
            raise UserError(f"{name}: {value!r} is not a user/group name or numeric id")
    opts = UnitOptions(args.package_path, args.driver_lib_dir, args.environment_file,
                       args.user, args.group)
    _write(router.render_unit(cfg, workers, os.path.abspath(args.config), opts), args.output)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.router:
        if args.models:
            raise UserError("--models and --router contradict each other (a router loads "
                            "no model)")
        return run_router(args)
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        raise UserError(f"invalid config: {e}") from None
    if args.package_path is None:
        args.package_path = default_package_path()
        print(f"sglang-dflash unit: note: the unit runs {args.package_path}/bin/sglang-dflash "
              "(this command's environment; --package-path names another)", file=sys.stderr)
    _check_paths(args, ("--package-path", "--driver-lib-dir", "--environment-file"))
    opts = UnitOptions(args.package_path, args.driver_lib_dir, args.environment_file,
                       args.user, args.group, args.fetch_models)
    render = render_models_unit if args.models else render_unit
    text = render(cfg, os.path.abspath(args.config), opts)  # UnitError: a UserError
    if not Path(opts.package_path, "bin", "sglang-dflash").exists():
        print(f"sglang-dflash unit: note: {opts.package_path}/bin/sglang-dflash does not exist "
              "on this machine yet", file=sys.stderr)
    if cfg.api_key_file and not Path(cfg.api_key_file).is_file():
        print(f"sglang-dflash unit: note: apiKeyFile {cfg.api_key_file} does not exist yet; "
              "systemd's LoadCredential= fails the start until it does", file=sys.stderr)
    _write(text, args.output)
    return 0
