"""The instance config the module writes is validated at build time by the project's own
validator: the module's config derivation runs `sglang-dflash serve --config $out
--print-argv`. Here the derivation's script, rendered by Nix, runs with bash against this
checkout's CLI: a config the option types accept but the validator refuses fails the build."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.module.test_module import EVAL, NIX, _need_lib

REPO = Path(__file__).resolve().parents[2]


def render(instances: str) -> dict:
    lib = _need_lib()
    # runCommand records what it was given (a real store file, its path in ExecStart).
    extra = ("{ runCommand = name: env: script: builtins.toFile name "
             "(builtins.toJSON { inherit env script; }); }")
    r = subprocess.run(
        [NIX, "--eval", "--read-write-mode", "--strict", "--json", str(EVAL),
         "--arg", "lib", f"import {lib}/lib",
         "--arg", "configuration", f"{{ services.sglang-dflash.instances = {instances}; }}",
         "--arg", "pkgsExtra", extra], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def build(tmp_path: Path, instances: str, name: str = "a") -> subprocess.CompletedProcess:
    unit = render(instances)["services"][f"sglang-dflash-{name}"]
    path = re.search(r"--config (\S+)", unit["serviceConfig"]["ExecStart"]).group(1)
    drv = json.loads(Path(path).read_text())
    assert [Path(p).name for p in drv["env"]["nativeBuildInputs"]] \
        and drv["env"]["passAsFile"] == ["config"]
    (tmp_path / "config").write_text(drv["env"]["config"])
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    shim = bindir / "sglang-dflash"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m sglang_dflash.cli \"$@\"\n")
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}",
           "PYTHONPATH": str(REPO / "src"), "configPath": str(tmp_path / "config"),
           "out": str(tmp_path / "out.json")}
    return subprocess.run(["bash", "-euc", drv["script"]], env=env, capture_output=True,
                          text=True, timeout=60)


def test_a_valid_config_builds(tmp_path):
    r = build(tmp_path, '{ a = { model = "m"; draftModel = "d"; algorithm = "ddtree"; }; }')
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "out.json").read_text())["ddtree"] == {"budget": 64,
                                                                         "policy": "fixed"}


def test_a_schedule_the_type_accepts_but_the_worker_would_refuse_fails_the_build(tmp_path):
    # "adaptive:1:0,99" matches the option's pattern; 99 > budget 16 is the validator's call
    r = build(tmp_path, '{ a = { model = "m"; draftModel = "d"; algorithm = "ddtree"; '
                        'ddtree.budget = 16; ddtree.policy = "adaptive:1:0,99"; }; }')
    assert r.returncode != 0
    assert "budget 99 at batch size 1 is outside 0..16" in r.stderr


def test_a_config_the_types_accept_but_the_validator_refuses_fails_the_build(tmp_path):
    # model = "-x" is a str for Nix, but serve would hand SGLang a flag: the validator says no.
    r = build(tmp_path, '{ a = { model = "-x"; algorithm = "none"; }; }')
    assert r.returncode != 0
    assert "invalid config" in r.stderr and "model" in r.stderr, r.stderr


def test_the_validator_is_what_fails(tmp_path):
    """Control: without the validator line the same script would succeed."""
    unit_ok = build(tmp_path, '{ a = { model = "-x"; algorithm = "none"; }; }')
    assert "--print-argv" in unit_ok.args[2]
    script = unit_ok.args[2].replace('sglang-dflash serve --config "$out" --print-argv', "true")
    env = {**os.environ, "configPath": str(tmp_path / "config"), "out": str(tmp_path / "o")}
    assert subprocess.run(["bash", "-euc", script], env=env).returncode == 0
    if not (tmp_path / "o").exists():
        pytest.fail("the script without the validator did not write the config")
