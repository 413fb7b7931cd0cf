"""`sglang-dflash check`: run the chosen layers, print one line per check (or JSON).

Exit 0 only without FAIL, 1 with any FAIL, 2 on a usage error. `--offline` is what
`nix flake check` and each service's ExecStartPre run: no GPU, no network. The models
layer (with --config) looks for the instance's models on disk: a local directory, or, for
an offline instance, a complete snapshot in its hub cache.
`--config FILE` reads an instance config: it fills the live layer's expectations (and,
for `--layer live`, the URL and API key); flags given explicitly win over it.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from sglang_dflash.apikey import read_api_key
from sglang_dflash.check import abi, gpu, live, package
from sglang_dflash.check.instance import (
    MODELS_LAYER,
    config_url,
    merged_expectations,
    model_results,
)
from sglang_dflash.check.result import Result, exit_code, render_json, render_text, skipped
from sglang_dflash.config import ConfigError, InstanceConfig, load_config
from sglang_dflash.errors import UserError
from sglang_dflash.manifest import PACKAGE_DIR, Manifest, load_manifest
from sglang_dflash.pins import load_pins

LAYERS = ("package", "abi", "gpu", "models", "live")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--offline", action="store_true",
                        help="no GPU, no network: the gpu and live layers SKIP")
    parser.add_argument("--layer", action="append", choices=LAYERS, dest="layers",
                        help="run only this layer (repeatable)")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--url", help="a running server, http(s)://host:port (live layer)")
    parser.add_argument("--expect-algorithm", choices=live.ALGORITHMS,
                        help="speculation the server must report")
    parser.add_argument("--expect-draft-model", metavar="PATH",
                        help="draft model path the server must report")
    parser.add_argument("--expect-ddtree-budget", type=int, metavar="N",
                        help="DDTree node budget (server verify width must be N+1)")
    parser.add_argument("--expect-ddtree-policy", metavar="POLICY",
                        help="DDTree budget policy the server must run (fixed, adaptive, "
                        "adaptive:<schedule>; needs the budget)")
    parser.add_argument("--api-key-file", type=Path, metavar="FILE",
                        help="file holding the server's API key (sent as a Bearer token)")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="S",
                        help="seconds per live request (default 5)")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="instance config (JSON, as the NixOS module writes it): expected "
                             "algorithm, draft model, DDTree budget; with --layer live also "
                             "the URL (host/port) and apiKeyFile. --url/--expect-*/"
                             "--api-key-file win over it")
    parser.add_argument("--manifest", type=Path, default=None, metavar="FILE",
                        help="manifest to verify against (default: the one installed with "
                             "sglang-dflash)")


def read_manifest(path: Path | None) -> tuple[Manifest | None, str]:
    try:
        return load_manifest(path), ""
    except FileNotFoundError:
        return None, f"{path or PACKAGE_DIR / 'manifest.json'} not found"
    except (OSError, ValueError) as exc:
        return None, str(exc)


@dataclass(frozen=True)
class LivePlan:
    """Where the live layer goes and what it expects; url None means it SKIPs."""

    url: str | None
    expectations: live.Expectations
    api_key: str | None
    skip_reason: str | None = None  # overrides live's own reason when url is None
    instance: InstanceConfig | None = None  # --config, for the models layer
    config_path: str | None = None


def run_checks(layers: list[str], args: argparse.Namespace, plan: LivePlan) -> list[Result]:
    pins = load_pins()
    entries = list(sys.path)
    manifest, err = read_manifest(args.manifest)
    out: list[Result] = []
    extensions = manifest.extensions if manifest else {}
    # started first: the extension imports (seconds, torch included) overlap the package layer
    imports = abi.start_imports(extensions) if "abi" in layers else None
    if "package" in layers:
        out += package.run_layer(manifest, err, pins.version("sglang"), PACKAGE_DIR, entries)
    if "abi" in layers:
        out += abi.run_layer(pins, extensions, entries, args.offline, imports)
    if "gpu" in layers:
        out += gpu.run_layer(pins, entries, args.offline)
    if "models" in layers:
        if plan.instance is None:
            out.append(skipped(MODELS_LAYER, "all", "no --config (the instance's models)"))
        else:
            out += model_results(plan.instance, str(plan.config_path), dict(os.environ))
    if "live" in layers:
        if plan.url is None and plan.skip_reason and not args.offline:
            out.append(skipped(live.LAYER, "all", plan.skip_reason))
        else:
            out += live.run_layer(plan.url, plan.expectations, args.timeout, plan.api_key,
                                  args.offline)
    return out


def read_instance(path: Path) -> InstanceConfig:
    """load_config, with the file named in every message (ConfigError, one line)."""
    try:
        return load_config(path)
    except ConfigError as exc:
        msg = str(exc)
        raise ConfigError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None


def read_key_file(path: Path) -> str:
    try:
        key = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--api-key-file: {getattr(exc, 'strerror', None) or exc}: "
                         f"{path}") from None
    if not key:
        raise ValueError(f"--api-key-file: {path} is empty")
    return key


def plan_live(args: argparse.Namespace, layers: list[str],
              cfg: InstanceConfig | None) -> LivePlan:
    """Flags first, then the config. ValueError/ConfigError (one line) on bad input.

    The config's URL and key are used only when the live layer is asked for by name
    (`--layer live`) and not --offline: the service preflight (`--offline --config`)
    must neither touch the network nor read a key file it may not be allowed to read.
    """
    exp = merged_expectations(cfg, args.expect_algorithm, args.expect_draft_model,
                              args.expect_ddtree_budget, args.expect_ddtree_policy)
    url = args.url
    asked = bool(args.layers) and "live" in args.layers and not args.offline
    if url is None and cfg is not None and asked:
        url = config_url(cfg)
        try:
            live.parse_url(url)
        except ValueError as exc:
            raise ConfigError(f"host/port give no usable URL: {exc}") from None
    api_key = read_key_file(args.api_key_file) if args.api_key_file is not None else None
    if api_key is None and cfg is not None and url is not None and "live" in layers:
        api_key = read_api_key(cfg, dict(os.environ))  # systemd's credential first, as serve
    reason = None
    if url is None and cfg is not None:
        reason = (f"no --url given; `--layer live` checks the configured server at "
                  f"{config_url(cfg)}")
    path = str(args.config) if args.config is not None else None
    return LivePlan(url, exp, api_key, reason, cfg, path)


def run(args: argparse.Namespace) -> int:
    layers = args.layers or list(LAYERS)
    if args.url is not None:
        if args.offline:
            raise UserError("--offline and --url contradict each other (--offline means no "
                               "network)")
        try:
            live.parse_url(args.url)
        except ValueError as exc:
            raise UserError(f"--url: {exc}") from None
    elif args.layers and "live" in args.layers and not args.offline and args.config is None:
        raise UserError("--layer live needs --url (or --config with the instance's host/port)")
    if not args.timeout > 0:
        raise UserError(f"--timeout must be > 0, got {args.timeout}")
    cfg = None
    if args.config is not None:
        try:
            cfg = read_instance(args.config)
        except ConfigError as exc:
            raise UserError(f"--config: {exc}") from None
    try:
        plan = plan_live(args, layers, cfg)
    except ConfigError as exc:
        raise UserError(f"--config: {exc}") from None
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.manifest is not None and not args.manifest.is_file():
        raise UserError(f"--manifest: {args.manifest} is not a file")
    results = run_checks(layers, args, plan)
    print(render_json(results) if args.json else render_text(results))
    return exit_code(results)
