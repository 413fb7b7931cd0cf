"""`sglang-dflash serve`: run one SGLang server from an instance config, as systemd expects.

The supervision (child process, /health, READY=1, signal forwarding) is
`sglang_dflash.serve`; this module reads the flags and the config.
"""

from __future__ import annotations

import argparse
import os

from sglang_dflash.config import ConfigError, load_config
from sglang_dflash.errors import UserError
from sglang_dflash.serve import TERM_GRACE_S, render_print, supervise


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="instance config (JSON)")
    parser.add_argument(
        "--print-argv",
        action="store_true",
        help="print the environment and command serve would run, then exit",
    )
    parser.add_argument(
        "--sandboxed",
        action="store_true",
        help="also refuse a model or cache directory the hardened unit's sandbox hides "
        "(PrivateTmp, ProtectHome: unit-hardening.json sandboxHides); the NixOS module's "
        "build-time check of the config passes it",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between /health polls while starting (0.05..5, default 1)",
    )
    parser.add_argument(
        "--stop-grace",
        type=float,
        default=TERM_GRACE_S,
        metavar="S",
        help=f"seconds SGLang gets after a forwarded signal before it is killed "
        f"(0.1..300, default {TERM_GRACE_S:g}; keep below the unit's TimeoutStopSec)",
    )


def run(args: argparse.Namespace) -> int:
    if not 0.05 <= args.poll_interval <= 5:
        raise UserError(f"--poll-interval: {args.poll_interval} is outside 0.05..5")
    if not 0.1 <= args.stop_grace <= 300:
        raise UserError(f"--stop-grace: {args.stop_grace} is outside 0.1..300")
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        raise UserError(f"invalid config: {e}") from None
    if args.sandboxed:
        from sglang_dflash.unit import check_instance_sandbox

        try:
            check_instance_sandbox(cfg)
        except UserError as e:
            raise UserError(f"invalid config: {args.config}: {e}") from None
    if args.print_argv:
        print(render_print(cfg))
        return 0
    return supervise(cfg, args.poll_interval, dict(os.environ), args.stop_grace)
