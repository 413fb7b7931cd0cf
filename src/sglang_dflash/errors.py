"""The one error base class for input a user can fix.

A command raises `UserError` (or a subclass: `ConfigError`, `UnitError`, the bench's usage
errors) with a one-line reason; `sglang_dflash.cli.main` catches it once, prints
`sglang-dflash <command>: <reason>` on stderr and exits with its `exit_code` (2 by default,
argparse's status for bad input). Library code raises it and never prints or exits itself.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input (a flag, a config file, a path); the message is one line."""

    exit_code = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
