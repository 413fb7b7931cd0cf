"""The router process `sglang-dflash router` starts: smg's own `smg launch`, key from a file.

`python -m sglang_dflash.router_child ARGV` parses ARGV with smg's launcher parser
(smg.launch_router.parse_router_args, what `smg launch` runs) and starts the router. The API
key never appears in ARGV (/proc/*/cmdline is world-readable): the launcher names the file
that holds it (systemd's credential or apiKeyFile) in SGLANG_DFLASH_ROUTER_KEY_FILE.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sglang_dflash.sglang_overlay import settings

KEY_FILE_ENV = settings.ROUTER_KEY_FILE_ENV


def main(argv: list[str]) -> int:
    try:
        from smg.launch_router import launch_router, parse_router_args
    except ImportError as e:
        print(f"sglang-dflash router: cannot import smg ({e}); install sglang-dflash[router]",
              file=sys.stderr)
        return 1
    args = parse_router_args(argv)
    key_file = os.environ.pop(KEY_FILE_ENV, None)
    if key_file:
        try:
            key = Path(key_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            print(f"sglang-dflash router: cannot read the API key {key_file}: "
                  f"{getattr(e, 'strerror', None) or e}", file=sys.stderr)
            return 1
        if not key or "\n" in key:
            print(f"sglang-dflash router: {key_file} must hold exactly one non-empty line",
                  file=sys.stderr)
            return 1
        args.api_key = key
    launch_router(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
