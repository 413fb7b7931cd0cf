"""`sglang-dflash router`: run SGLang's router (smg) over instances from a router config.

Loading, rendering and supervising are `sglang_dflash.router`; this module reads the flags.
"""

from __future__ import annotations

import argparse
import importlib.util
import os

from sglang_dflash.config import ConfigError
from sglang_dflash.errors import UserError
from sglang_dflash.router import load_router_config, render_print, resolve_workers, supervise


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="router config (JSON)")
    parser.add_argument("--print-argv", action="store_true",
                        help="print the command the router would run, then exit")
    parser.add_argument("--poll-interval", type=float, default=0.5, metavar="S",
                        help="seconds between /health polls while starting (0.05..5)")
    parser.add_argument("--stop-grace", type=float, default=30.0, metavar="S",
                        help="seconds smg gets after a forwarded signal (0.1..300, default 30)")


def run(args: argparse.Namespace) -> int:
    if not 0.05 <= args.poll_interval <= 5:
        raise UserError(f"--poll-interval: {args.poll_interval} is outside 0.05..5")
    if not 0.1 <= args.stop_grace <= 300:
        raise UserError(f"--stop-grace: {args.stop_grace} is outside 0.1..300")
    try:
        cfg = load_router_config(args.config)
        workers = resolve_workers(cfg)
    except ConfigError as e:
        raise UserError(f"invalid config: {e}") from None
    urls = [w.url for w in workers]
    if args.print_argv:
        print(render_print(cfg, urls, dict(os.environ)))
        return 0
    if importlib.util.find_spec("smg") is None:
        raise UserError("the router (smg) is not installed in this environment: install "
                        "sglang-dflash[router] (`nix build .#sglang-dflash` has it)",
                        exit_code=1)
    try:
        return supervise(cfg, urls, args.poll_interval, dict(os.environ), args.stop_grace)
    except ConfigError as e:
        raise UserError(str(e)) from None
