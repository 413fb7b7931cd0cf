"""`sglang-dflash fetch-models`: download an instance's pinned hub models ahead of its server.

What the loader unit (sglang-dflash-<name>-models.service) runs before the server, which
then serves with HF_HUB_OFFLINE=1. The work is `sglang_dflash.models`; this module reads the
flags and the config. A snapshot already in the cache is not fetched again (no network).
"""

from __future__ import annotations

import argparse
import os
import sys

from sglang_dflash.config import ConfigError, load_config
from sglang_dflash.errors import UserError
from sglang_dflash.models import Backoff, fetch, hub_cache_dir

DEFAULT = Backoff()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="instance config (JSON)")
    parser.add_argument("--tries", type=int, default=DEFAULT.tries, metavar="N",
                        help=f"attempts per model (1..20, default {DEFAULT.tries})")
    parser.add_argument("--retry-delay", type=float, default=DEFAULT.base, metavar="S",
                        help=f"first wait between attempts, doubling (0..600, default "
                        f"{DEFAULT.base:g})")
    parser.add_argument("--max-delay", type=float, default=DEFAULT.cap, metavar="S",
                        help=f"longest wait between attempts (0..3600, default {DEFAULT.cap:g})")
    parser.add_argument("--give-up-after", type=float, default=DEFAULT.total, metavar="S",
                        help=f"most seconds spent waiting in all (0..86400, default "
                        f"{DEFAULT.total:g})")
    parser.add_argument("--print-cache", action="store_true",
                        help="print the hub cache directory the server reads, then exit")


def _backoff(args: argparse.Namespace) -> Backoff:
    for flag, value, hi in (("--retry-delay", args.retry_delay, 600),
                            ("--max-delay", args.max_delay, 3600),
                            ("--give-up-after", args.give_up_after, 86400)):
        if not 0 <= value <= hi:  # also refuses nan
            raise UserError(f"{flag}: {value} is outside 0..{hi}")
    if not 1 <= args.tries <= 20:
        raise UserError(f"--tries: {args.tries} is outside 1..20")
    return Backoff(args.tries, args.retry_delay, args.max_delay, args.give_up_after)


def _log(line: str) -> None:
    print(f"sglang-dflash fetch-models: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    backoff = _backoff(args)
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        raise UserError(f"invalid config: {e}") from None
    environ = dict(os.environ)
    if args.print_cache:
        print(hub_cache_dir(cfg, environ))
        return 0
    if not cfg.offline:
        _log("note: the config is not offline (a hub id without a pinned commit, or "
             "offline=false): SGLang may still reach the hub at start")
    os.environ.update(dict(cfg.environment))  # HF_ENDPOINT and friends, as serve's child sees
    for line in fetch(cfg, environ, backoff, _log):  # FetchError: one line, exit 1
        print(line)
    return 0
