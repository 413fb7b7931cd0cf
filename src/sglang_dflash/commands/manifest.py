"""`sglang-dflash manifest`: print, write (`--write`) or check (`--check`) manifest.json.

What goes into the manifest is `sglang_dflash.manifest`; this module reads the flags.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

from sglang_dflash.errors import UserError
from sglang_dflash.manifest import (
    FIX_STALE,
    MANIFEST_FILE,
    OVERLAY_FILE,
    PACKAGE_DIR,
    build_manifest,
    load_manifest,
    parse_overlay,
    stale_reasons,
)
from sglang_dflash.pins import load_pins


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--write", action="store_true",
                        help="regenerate manifest.json from pins.toml, overlay.toml and the files")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 naming what is stale if manifest.json is out of date")
    parser.add_argument("--root", type=Path, default=PACKAGE_DIR,
                        help="the sglang_dflash package directory (default: this one)")
    parser.add_argument("--patched-root", type=Path, default=None,
                        help="site dir holding the patched sglang (only when patches exist)")


def run(args: argparse.Namespace) -> int:
    root: Path = args.root
    try:
        overlay = parse_overlay((root / OVERLAY_FILE).read_text())
        fresh = build_manifest(load_pins(), overlay, root, args.patched_root)
    except (OSError, ValueError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise UserError(str(exc)) from None
    target = root / MANIFEST_FILE
    if args.write:
        text = fresh.to_json()
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
            print(f"wrote {target} ({len(fresh.overlay_files)} overlay files)")
        else:
            print(f"{target} already up to date")
        return 0
    if args.check:
        try:
            committed = load_manifest(target)
        except FileNotFoundError:
            print(f"STALE {target}: missing — fix: {FIX_STALE}")
            return 1
        except ValueError as exc:
            print(f"STALE {target}: {exc} — fix: {FIX_STALE}")
            return 1
        reasons = stale_reasons(committed, fresh)
        for r in reasons:
            print(f"STALE {target}: {r}")
        if reasons:
            print(f"fix: {FIX_STALE}")
            return 1
        print(f"{target} is up to date")
        return 0
    print(fresh.to_json(), end="")
    return 0
