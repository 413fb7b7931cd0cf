"""The `sglang-dflash` command: one entry point, one module per subcommand.

Each subcommand is a module of `sglang_dflash.commands` exposing `add_arguments(parser)`
and `run(args) -> int`. Modules are imported only when their subcommand runs, so `check`
stays fast and no subcommand pays for another's imports. Bad input anywhere is a
`sglang_dflash.errors.UserError`, reported here once as one line. Exit codes: 0 success,
1 a check or run failed, 2 a usage or input error (argparse's own convention).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from sglang_dflash.errors import UserError

# subcommand -> (module in sglang_dflash.commands, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "check": ("check", "verify the package, ABI, GPUs and a live server"),
    "serve": ("serve", "run one SGLang DFlash/DDTree server from a config file"),
    "unit": ("unit", "render the hardened systemd unit for a non-NixOS host"),
    "fetch-models": ("fetch_models", "download an instance's pinned hub models before serving"),
    "router": ("router", "run SGLang's router (smg) over instances from a config"),
    "bench": ("bench", "benchmark a server or a sweep of configurations"),
    "manifest": ("manifest", "print or write the overlay manifest"),
    "pins": ("pins", "print the pins, or sync pyproject's gpu extra from them"),
}


class OneLineErrors(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit 2, not the whole usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """Build the top-level parser, importing only the chosen subcommand's module."""
    parser = OneLineErrors(prog="sglang-dflash", description=__doc__.splitlines()[0])
    from sglang_dflash import __version__

    parser.add_argument("--version", action="version", version=f"sglang-dflash {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=OneLineErrors)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            mod = importlib.import_module(f"sglang_dflash.commands.{module}")
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run)
    return parser


# What a shell reports for a process ended by SIGPIPE: `cmd | head -1` is not a failure.
BROKEN_PIPE_EXIT = 141


def quiet_broken_pipe() -> int:
    """The reader of our stdout went away (`| head`): exit quietly, as cat and grep do.

    stdout is pointed at /dev/null so the interpreter's final flush cannot raise again.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return BROKEN_PIPE_EXIT


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (a stray newline must not split the report)."""
    return " ".join(str(exc).splitlines()) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = None
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        command = args.command
        code = int(args._run(args))
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except UserError as exc:
        prog = f"sglang-dflash {command}" if command else "sglang-dflash"
        print(f"{prog}: {one_line(exc)}", file=sys.stderr, flush=True)
        return exc.exit_code
    except BrokenPipeError:
        return quiet_broken_pipe()
    except KeyboardInterrupt:
        print("sglang-dflash: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
