"""The command's front door: subcommand dispatch and one-line usage errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sglang_dflash.cli import SUBCOMMANDS


def sgd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang_dflash", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("argv", [["bogus"], [], ["check", "--layer", "bogus"],
                                  ["serve", "--no-such-flag"]])
def test_usage_errors_are_one_line_and_exit_2(argv):
    p = sgd(*argv)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_has_help(name):
    p = sgd(name, "--help")
    assert p.returncode == 0, p.stderr
    assert name in p.stdout


def test_version():
    p = sgd("--version")
    assert p.returncode == 0 and p.stdout.startswith("sglang-dflash ")
