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

from sglang_dflash.config import parse_config
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
    return build_rendered(tmp_path, render(instances), name)


def build_rendered(tmp_path: Path, evaluated: dict, name: str = "a") -> subprocess.CompletedProcess:
    """Run the config derivation's script (as Nix rendered it) for instance `name`."""
    unit = evaluated["services"][f"sglang-dflash-{name}"]
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
    script = unit_ok.args[2].replace(
        'sglang-dflash serve --config "$out" --print-argv --sandboxed', "true")
    assert script != unit_ok.args[2]
    env = {**os.environ, "configPath": str(tmp_path / "config"), "out": str(tmp_path / "o")}
    assert subprocess.run(["bash", "-euc", script], env=env).returncode == 0
    if not (tmp_path / "o").exists():
        pytest.fail("the script without the validator did not write the config")


# One instance's values are the validator's, not the module's assertions (issue 13 item 5):
# each configuration evaluates with no failed assertion, and the config derivation's script
# (serve --config $out --print-argv --sandboxed) fails with one line naming the field.
SHA = "0123456789abcdef0123456789abcdef01234567"
VALIDATED = {
    "tp-mismatch": (
        '{ a = { model = "m"; algorithm = "none"; gpus = [ 0 1 ]; tensorParallelSize = 4; }; }',
        "tensorParallelSize: 4 does not match the 2 GPU(s) in gpus [0, 1]",
    ),
    "tp-mismatch-multinode": (
        '{ a = { model = "m"; algorithm = "none"; gpus = [ 1 2 ]; tensorParallelSize = 2; '
        'multiNode = { nnodes = 2; nodeRank = 0; distInitAddr = "10.0.0.1:20000"; }; }; }',
        "tensorParallelSize: 2 does not match the 2 GPU(s) in gpus [1, 2] x 2 nodes",
    ),
    "ddtree-no-draft": (
        '{ a = { model = "m"; algorithm = "ddtree"; }; }',
        "draftModel: algorithm 'ddtree' needs a draft model",
    ),
    "key-in-store": (
        '{ a = { model = "m"; algorithm = "none"; apiKeyFile = "/nix/store/x-key"; }; }',
        "apiKeyFile: /nix/store/x-key is in the Nix store, which every local user can read",
    ),
    "config-flag": (
        '{ a = { model = "m"; algorithm = "none"; extraArgs = [ "--config" "x.yaml" ]; }; }',
        "extraArgs: --config is reserved for serve",
    ),
    "cuda-env": (
        '{ a = { model = "m"; algorithm = "none"; environment.CUDA_VISIBLE_DEVICES = "3"; }; }',
        "environment.CUDA_VISIBLE_DEVICES: set the GPUs with `gpus` instead",
    ),
    "budget-env": (
        '{ a = { model = "m"; algorithm = "none"; '
        'environment.SGLANG_DFLASH_DDTREE_BUDGET = "8"; }; }',
        "environment.SGLANG_DFLASH_DDTREE_BUDGET: set `ddtree.budget` instead",
    ),
    "policy-env": (
        '{ a = { model = "m"; algorithm = "none"; '
        'environment.SGLANG_DFLASH_DDTREE_POLICY = "adaptive"; }; }',
        "environment.SGLANG_DFLASH_DDTREE_POLICY: set `ddtree.policy` instead",
    ),
    "hf-offline-env": (
        '{ a = { model = "m"; algorithm = "none"; environment.HF_HUB_OFFLINE = "0"; }; }',
        "environment.HF_HUB_OFFLINE: set `offline` instead",
    ),
    "offline-unpinned": (
        '{ a = { model = "Qwen/Qwen3-8B"; draftModel = "z-lab/d"; draftModelRevision = "'
        + SHA + '"; offline = true; }; }',
        "modelRevision: offline serving of hub id 'Qwen/Qwen3-8B' needs a pinned commit "
        "(40 hex digits), got not set",
    ),
    "offline-draft-on-a-branch": (
        '{ a = { model = "/srv/m"; draftModel = "z-lab/d"; draftModelRevision = "main"; '
        "offline = true; }; }",
        "draftModelRevision: offline serving of hub id 'z-lab/d' needs a pinned commit "
        "(40 hex digits), got 'main', not a 40-hex commit",
    ),
    "model-in-tmp": (
        '{ a = { model = "/tmp/qwen"; algorithm = "none"; }; }',
        "model: /tmp/qwen is hidden from the service by PrivateTmp=true",
    ),
    "draft-in-home": (
        '{ a = { model = "m"; draftModel = "/home/me/d"; algorithm = "dflash"; }; }',
        "draftModel: /home/me/d is hidden from the service by ProtectHome=true",
    ),
}


# The one per-instance assertion left: a secret flag in extraArgs must stop evaluation, since
# the build-time validator only sees the config once it (and the key) is in the Nix store.
SECRET = {
    "inline-key-extra-args": (
        '{ a = { model = "m"; algorithm = "none"; extraArgs = [ "--api-key=sk-1" ]; }; }',
        "--api-key", "extraArgs: --api-key puts the key on the command line; use apiKeyFile"),
    "admin-key-extra-args": (
        '{ a = { model = "m"; algorithm = "none"; extraArgs = [ "--admin-api-key" "k" ]; }; }',
        "--admin-api-key", "extraArgs: --admin-api-key puts the key on the command line"),
    "abbreviated-key": (
        '{ a = { model = "m"; algorithm = "none"; extraArgs = [ "--api-k=sk-1" ]; }; }',
        "--api-k", "extraArgs: --api-k abbreviates --api-key, which serve owns"),
}


@pytest.mark.parametrize("case", sorted(SECRET))
def test_a_secret_flag_fails_evaluation_before_the_store(tmp_path, case):
    instances, flag, validator = SECRET[case]
    evaluated = render(instances)
    assert evaluated["failedAssertions"] == [
        f"services.sglang-dflash.instances.a.extraArgs: {flag} would put a key in the "
        "world-readable Nix store; use apiKeyFile."]
    r = build_rendered(tmp_path, evaluated)  # and the validator refuses it too
    assert r.returncode == 2 and validator in r.stderr, (r.stdout, r.stderr)


def test_a_flag_that_only_looks_like_a_secret_passes():
    """Neither the flag nor an abbreviation of it (the validator's rule)."""
    assert render('{ a = { model = "m"; algorithm = "none"; extraArgs = [ "--api-key-file-x" '
                  '"--max-running-requests=4" ]; }; }')["failedAssertions"] == []


@pytest.mark.parametrize("case", sorted(VALIDATED))
def test_one_instance_is_checked_by_the_validator_not_an_assertion(tmp_path, case):
    instances, message = VALIDATED[case]
    evaluated = render(instances)
    assert evaluated["failedAssertions"] == []  # no module assertion for it any more
    r = build_rendered(tmp_path, evaluated)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sglang-dflash serve: invalid config: "), lines
    assert message in lines[0], lines


def test_the_sandbox_check_is_what_refuses_a_model_in_tmp(tmp_path):
    """Control: a model under /tmp is a valid config for serve by hand (parse_config takes
    it); the build-time check refuses it because it passes --sandboxed."""
    evaluated = render('{ a = { model = "/tmp/qwen"; algorithm = "none"; }; }')
    assert parse_config(evaluated["configs"]["a"]).model == "/tmp/qwen"
    (tmp_path / "a.json").write_text(json.dumps(evaluated["configs"]["a"]))
    r = subprocess.run([sys.executable, "-m", "sglang_dflash.cli", "serve", "--config",
                        str(tmp_path / "a.json"), "--print-argv"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert r.returncode == 0, r.stderr


def test_a_valid_config_with_every_path_option_builds(tmp_path):
    """Control for VALIDATED: the same kinds of values, valid, pass the same script."""
    r = build(tmp_path, '{ a = { model = "/srv/m"; draftModel = "z-lab/d"; draftModelRevision = "'
              + SHA + '"; offline = true; apiKeyFile = "/run/keys/k"; gpus = [ 0 1 ]; '
              'tensorParallelSize = 2; environment.NCCL_DEBUG = "WARN"; '
              'extraArgs = [ "--cuda-graph-max-bs" "8" ]; }; }')
    assert r.returncode == 0, r.stderr
