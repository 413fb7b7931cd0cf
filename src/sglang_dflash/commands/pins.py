"""`sglang-dflash pins`: print the pins (`show`) or rewrite pyproject's gpu and router extras
(`sync`).

Reading and rendering the pins is `sglang_dflash.pins`; this module reads the flags.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from sglang_dflash.errors import UserError
from sglang_dflash.pins import load_pins, sync_pyproject


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action", nargs="?", default="show", choices=["show", "sync"],
        help="show: print the pins as JSON; sync: rewrite pyproject's gpu and router extras",
    )
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"),
                        help="pyproject.toml to sync (default: ./pyproject.toml)")


def run(args: argparse.Namespace) -> int:
    pins = load_pins()
    if args.action == "show":
        print(json.dumps(asdict(pins), indent=2))
        return 0
    try:
        text = args.pyproject.read_text()
        new = sync_pyproject(text, pins)
    except (OSError, ValueError) as exc:
        raise UserError(f"sync: {exc}") from None
    if new != text:
        args.pyproject.write_text(new)
        print(f"updated {args.pyproject}")
    else:
        print(f"{args.pyproject} already matches the pins")
    return 0
