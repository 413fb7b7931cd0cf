"""`sglang-dflash check`: run the chosen layers, print one line per check (or JSON).

Exit 0 only without FAIL, 1 with any FAIL, 2 on a usage error. `--offline` is what
`nix flake check` and each service's ExecStartPre run: no GPU, no network.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglang_dflash.check import abi, gpu, live, package
from sglang_dflash.check.result import Result, exit_code, render_json, render_text
from sglang_dflash.manifest import PACKAGE_DIR, Manifest, load_manifest
from sglang_dflash.pins import load_pins

LAYERS = ("package", "abi", "gpu", "live")


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
    parser.add_argument("--api-key-file", type=Path, metavar="FILE",
                        help="file holding the server's API key (sent as a Bearer token)")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="S",
                        help="seconds per live request (default 5)")
    parser.add_argument("--manifest", type=Path, default=None, metavar="FILE",
                        help="manifest to verify against (default: the one installed with "
                             "sglang-dflash)")


def usage_error(msg: str) -> int:
    print(f"sglang-dflash check: {msg}", file=sys.stderr)
    return 2


def read_manifest(path: Path | None) -> tuple[Manifest | None, str]:
    try:
        return load_manifest(path), ""
    except FileNotFoundError:
        return None, f"{path or PACKAGE_DIR / 'manifest.json'} not found"
    except (OSError, ValueError) as exc:
        return None, str(exc)


def run_checks(layers: list[str], args: argparse.Namespace, exp: live.Expectations,
               api_key: str | None) -> list[Result]:
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
    if "live" in layers:
        out += live.run_layer(args.url, exp, args.timeout, api_key, args.offline)
    return out


def run(args: argparse.Namespace) -> int:
    layers = args.layers or list(LAYERS)
    if args.url is not None:
        if args.offline:
            return usage_error("--offline and --url contradict each other (--offline means no "
                               "network)")
        try:
            live.parse_url(args.url)
        except ValueError as exc:
            return usage_error(f"--url: {exc}")
    elif args.layers and "live" in args.layers and not args.offline:
        return usage_error("--layer live needs --url")
    if not args.timeout > 0:
        return usage_error(f"--timeout must be > 0, got {args.timeout}")
    try:
        exp = live.expectations_from(args.expect_algorithm, args.expect_draft_model,
                                     args.expect_ddtree_budget)
    except ValueError as exc:
        return usage_error(str(exc))
    api_key = None
    if args.api_key_file is not None:
        try:
            api_key = args.api_key_file.read_text().strip()
        except OSError as exc:
            return usage_error(f"--api-key-file: {exc.strerror}: {args.api_key_file}")
        if not api_key:
            return usage_error(f"--api-key-file: {args.api_key_file} is empty")
    if args.manifest is not None and not args.manifest.is_file():
        return usage_error(f"--manifest: {args.manifest} is not a file")
    results = run_checks(layers, args, exp, api_key)
    print(render_json(results) if args.json else render_text(results))
    return exit_code(results)
