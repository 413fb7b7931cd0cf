"""Review findings in `sglang-dflash unit`: every value lands in the unit as systemd reads it.

Values are either escaped for the directive they land in (specifiers %, $ in arguments,
quotes, backslashes) or refused with one line naming the option (control characters,
which would start a new directive; names systemd itself refuses).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_dflash.config import parse_config
from sglang_dflash.unit import UnitError, UnitOptions, render_unit
from tests.systemd_unit.systemd_tools import analyze_verify, package_prefix

BASE = {"name": "qwen", "model": "Qwen/Qwen3-8B", "draftModel": "z-lab/d",
        "algorithm": "ddtree", "gpus": [0]}
ODD = '/etc/my dir/50%n $HOME "q" \'s\' back\\slash;.json'


def systemd_words(value: str) -> list[str]:
    """ExecStart= word splitting as systemd.service(5) "Command lines" describes it:
    whitespace-separated words, "..." / '...' quoting with C escapes, then %% -> % and, in
    arguments only, $$ -> $ (a lone $ would be a variable reference)."""
    words, i = [], 0
    escapes = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", " ": " "}
    while i < len(value):
        if value[i].isspace():
            i += 1
            continue
        word, quote = "", None
        while i < len(value) and (quote or not value[i].isspace()):
            c = value[i]
            if c == "\\":
                word += escapes[value[i + 1]]
                i += 2
                continue
            if quote and c == quote:
                quote = None
            elif not quote and c in "\"'":
                quote = c
            else:
                word += c
            i += 1
        assert quote is None, f"unterminated quote in {value!r}"
        words.append(word)
    out = []
    for n, w in enumerate(words):
        assert "%" not in w.replace("%%", ""), f"unescaped specifier in {w!r}"
        w = w.replace("%%", "%")
        if n:
            assert "$" not in w.replace("$$", ""), f"variable reference in {w!r}"
            w = w.replace("$$", "$")
        out.append(w)
    return out


def directive(text: str, key: str) -> list[str]:
    return [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith(key + "=")]


def test_exec_lines_parse_back_to_the_intended_argv():
    pkg = "/opt/sglang dflash/50%n/$X"
    text = render_unit(parse_config(BASE), ODD, UnitOptions(package_path=pkg))
    exe = f"{pkg}/bin/sglang-dflash"
    assert [systemd_words(v) for v in directive(text, "ExecStart")] == [
        [exe, "serve", "--config", ODD]]
    assert [systemd_words(v) for v in directive(text, "ExecStartPre")] == [
        [exe, "check", "--offline", "--config", ODD]]


def test_literal_paths_escape_specifiers():
    cfg = parse_config({**BASE, "apiKeyFile": "/run/keys/50%i"})
    text = render_unit(cfg, "/etc/q.json", UnitOptions(driver_lib_dir="/opt/nv%d/lib",
                                                      environment_file="/etc/env%h"))
    assert directive(text, "LoadCredential") == ["api-key:/run/keys/50%%i"]
    assert directive(text, "EnvironmentFile") == ["/etc/env%%h"]
    assert '"LD_LIBRARY_PATH=/opt/nv%%d/lib"' in text
    assert '"HOME=%S/sglang-dflash-qwen"' in text  # the one intended specifier stays


@pytest.mark.parametrize(
    ("raw", "opts", "name"),
    [({}, {"driver_lib_dir": "/lib\nExecStartPre=/bin/evil"}, "--driver-lib-dir"),
     ({}, {"environment_file": "/e\nUser=root"}, "--environment-file"),
     ({}, {"package_path": "/p\r"}, "--package-path"),
     ({}, {"package_path": '/p"q'}, "--package-path"),
     ({}, {"user": "svc\nUser=root"}, "--user"),
     ({}, {"user": "svc", "group": "a b"}, "--group")],
)
def test_unsafe_values_are_refused_naming_the_option(raw, opts, name):
    with pytest.raises(UnitError) as exc:
        render_unit(parse_config({**BASE, **raw}), "/etc/q.json", UnitOptions(**opts))
    assert str(exc.value).startswith(name) and "\n" not in str(exc.value)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """A fixed --package-path: this interpreter's own prefix may be one the sandbox hides."""
    if "--package-path" not in args:
        args = ("--package-path", "/opt/sglang-dflash", *args)
    return subprocess.run([sys.executable, "-m", "sglang_dflash", "unit", *args],
                          capture_output=True, text=True, timeout=30)


def test_cli_refuses_a_config_path_that_would_inject_a_directive(tmp_path):
    evil = tmp_path / "x\nExecStartPre=!/bin/sh -c id"
    evil.mkdir(parents=True)
    (evil / "q.json").write_text(json.dumps(BASE))
    r = run_cli("--config", str(evil / "q.json"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--config" in r.stderr and "control characters" in r.stderr
    assert "ExecStartPre=!" not in r.stdout


def test_cli_refuses_a_bad_user_in_one_line(tmp_path):
    config = tmp_path / "q.json"
    config.write_text(json.dumps(BASE))
    r = run_cli("--config", str(config), "--user", "svc\nExecStartPre=/x")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--user" in r.stderr


def test_systemd_resolves_an_odd_executable_path(tmp_path, visible_tmp):
    """systemd-analyze verify checks ExecStart's executable exists: $ and % must survive."""
    prefix = visible_tmp / "pre fix 50%n $X"
    exe = package_prefix(prefix)
    unit = tmp_path / "sglang-dflash-qwen.service"
    cfg = parse_config({**BASE, "apiKeyFile": "/etc/k 50%i"})
    unit.write_text(render_unit(cfg, ODD, UnitOptions(package_path=str(prefix),
                                                      environment_file="/etc/e 50%h")))
    rc, problems, _output = analyze_verify(unit, tmp_path)
    assert rc == 0 and problems == [], problems
    assert Path(exe).exists()
