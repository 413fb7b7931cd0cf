"""The command's front door: subcommand dispatch, one-line usage errors, closed pipes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_dflash.cli import BROKEN_PIPE_EXIT, SUBCOMMANDS

REPO = Path(__file__).resolve().parents[1]


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


@pytest.mark.parametrize("argv", [
    ["pins", "show"],
    ["manifest"],
    ["check", "--offline", "--layer", "package"],
    ["serve", "--print-argv", "--config", str(REPO / "examples" / "qwen3-8b-ddtree.json")],
])
def test_closed_pipe_is_a_quiet_exit(argv):
    """`sglang-dflash ... | head -1`: the reader is gone before we write; no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails with EPIPE, deterministically
    try:
        p = subprocess.run([sys.executable, "-m", "sglang_dflash", *argv], stdout=write_end,
                           stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr
    assert p.returncode == BROKEN_PIPE_EXIT, p.stderr


@pytest.mark.parametrize("command", ["serve", "unit", "check"])
def test_field_errors_name_the_file_and_the_nearest_key(tmp_path, command):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "modle": "m", "algorithm": "none"}')
    p = sgd(command, "--config", str(bad), *(["--offline"] if command == "check" else []))
    assert p.returncode == 2, p.stderr
    line, = p.stderr.strip().splitlines()
    assert str(bad) in line and "modle: unknown key; did you mean 'model'?" in line, line


def test_unknown_ddtree_key_suggests_budget(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "model": "m", "draftModel": "d", "ddtree": {"budjet": 8}}')
    p = sgd("serve", "--print-argv", "--config", str(bad))
    assert p.returncode == 2 and "ddtree.budjet: unknown key (did you mean 'budget'?)" in p.stderr
