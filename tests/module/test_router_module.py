"""services.sglang-dflash.routers and the instances' multiNode/metrics options, evaluated
with nixpkgs lib (tests/module/eval-router.nix); the JSON the module writes is fed through
the Python validators and renderers, so Nix and Python agree. SKIPs without nix-instantiate
or SGLANG_DFLASH_NIXPKGS_LIB (docs/nix.md)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_dflash.config import parse_config, render_argv
from sglang_dflash.router import parse_router_config
from sglang_dflash.router import render_argv as router_argv

EVAL = Path(__file__).with_name("eval-router.nix")
NIX = shutil.which("nix-instantiate")
LIB = os.environ.get("SGLANG_DFLASH_NIXPKGS_LIB")
pytestmark = [pytest.mark.nixlib]

A = '{ model = "m"; algorithm = "none"; port = 31001; gpus = [ 0 ]; metrics.enable = true; }'
B = ('{ model = "m"; algorithm = "none"; port = 31002; gpus = [ 1 2 ]; openFirewall = true; '
     'multiNode = { nnodes = 2; nodeRank = 0; distInitAddr = "10.0.0.1:20000"; }; }')


def evaluate(instances: str, routers: str) -> dict:
    if NIX is None:
        pytest.skip("nix-instantiate is not installed")
    if not LIB or not (Path(LIB) / "lib" / "default.nix").is_file():
        pytest.skip("SGLANG_DFLASH_NIXPKGS_LIB is not set to a nixpkgs.lib checkout")
    conf = (f"{{ services.sglang-dflash.instances = {instances}; "
            f"services.sglang-dflash.routers = {routers}; }}")
    r = subprocess.run([NIX, "--eval", "--strict", "--json", str(EVAL), "--arg", "lib",
                        f"import {LIB}/lib", "--arg", "configuration", conf],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def router_json(unit: dict) -> dict:
    m = re.search(r"--config ROUTER<(.*)>$", unit["serviceConfig"]["ExecStart"], re.S)
    assert m, unit["serviceConfig"]["ExecStart"]
    return json.loads(m.group(1))


def test_router_unit_config_and_instances_agree_with_python():
    out = evaluate(f"{{ a = {A}; b = {B}; }}",
                   '{ front = { workers = [ "a" "b" "http://10.0.0.9:30000" ]; '
                   'policy = "round_robin"; port = 8000; openFirewall = true; '
                   'healthCheck.intervalSecs = 5; apiKeyFile = "/run/keys/r"; }; }')
    assert out["failedAssertions"] == []
    unit = out["services"]["sglang-dflash-router-front"]
    assert unit["after"] == ["network-online.target", "sglang-dflash-a.service",
                             "sglang-dflash-b.service"]
    sc = unit["serviceConfig"]
    assert sc["Type"] == "notify" and sc["PrivateDevices"] is True and sc["DeviceAllow"] == []
    assert sc["LoadCredential"] == "api-key:/run/keys/r"
    raw = router_json(unit)
    workers = raw["workers"]
    assert workers[2] == "http://10.0.0.9:30000"
    inst = [parse_config(json.loads(w[len("INSTANCE<"):-1])) for w in workers[:2]]
    assert [i.name for i in inst] == ["a", "b"]
    assert "--enable-metrics" in render_argv(inst[0])
    argv_b = render_argv(inst[1])
    assert argv_b[argv_b.index("--nnodes") + 1] == "2"
    assert argv_b[argv_b.index("--tp-size") + 1] == "4"  # default: 2 GPUs x 2 nodes
    cfg = parse_router_config({**raw, "workers": ["http://127.0.0.1:31001",
                                                  "http://127.0.0.1:31002", workers[2]]})
    argv = router_argv(cfg, list(cfg.workers))
    assert argv[argv.index("--policy") + 1] == "round_robin"
    assert argv[argv.index("--health-check-interval-secs") + 1] == "5"
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    # router port, instance b's port, and rank 0's dist-init port (openFirewall)
    assert sorted(out["firewall"]) == [8000, 20000, 31002]


@pytest.mark.parametrize(
    ("instances", "routers", "fragment"),
    [
        (f"{{ a = {A}; }}", '{ r = { workers = [ "nope" ]; }; }',
         'workers: "nope" is neither an enabled instance'),
        ("{ b = " + B.replace("nodeRank = 0", "nodeRank = 1") + "; }",
         '{ r = { workers = [ "b" ]; }; }', 'instance "b" is node rank 1'),
        (f"{{ a = {A}; }}", '{ r = { workers = [ "a" ]; port = 31001; }; }',
         "port 31001 is used by instance \"a\", router \"r\""),
        (f"{{ a = {A}; }}", '{ r = { workers = [ "a" ]; metrics.port = 31001; }; }',
         "port 31001 is used by"),
        ("{ a = " + A.replace("metrics.enable = true;", 'apiKeyFile = "/run/k";') + "; }",
         '{ r = { workers = [ "a" ]; }; }', 'worker instance "a" requires an API key'),
        ("{ b = " + B.replace("nodeRank = 0", "nodeRank = 2") + "; }", "{ }",
         "multiNode.nodeRank = 2 must be below nnodes = 2"),
        ("{ b = " + B.replace("gpus = [ 1 2 ];", "gpus = [ ]; tensorParallelSize = 3;")
         + "; }", "{ }", "tensorParallelSize = 3 is not divisible by nnodes = 2"),
    ],
)
def test_assertions_name_the_option(instances, routers, fragment):
    """What crosses the router and the instances (or a multi-node group's fields)."""
    out = evaluate(instances, routers)
    assert any(fragment in m for m in out["failedAssertions"]), out["failedAssertions"]


def router_cli(tmp_path: Path, raw: dict) -> subprocess.CompletedProcess:
    """`sglang-dflash router --config FILE --print-argv` (the router config derivation's
    check) on the JSON the module wrote, its instance configs written out as files."""
    workers = []
    for i, w in enumerate(raw["workers"]):
        if w.startswith("INSTANCE<"):
            path = tmp_path / f"instance-{i}.json"
            path.write_text(w[len("INSTANCE<"):-1])
            w = str(path)
        workers.append(w)
    config = tmp_path / "router.json"
    config.write_text(json.dumps({**raw, "workers": workers}))
    src = str(Path(__file__).parents[2] / "src")
    return subprocess.run([sys.executable, "-m", "sglang_dflash.cli", "router", "--config",
                           str(config), "--print-argv"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": src})


@pytest.mark.parametrize(("router", "flag"), [
    ('extraArgs = [ "--api-key" "x" ];', "--api-key"),
    ('extraArgs = [ "--tenant-api-key=x" ];', "--tenant-api-key"),
    ('extraArgs = [ "--control-plane-api-keys" "x" ];', "--control-plane-api-keys"),
    ('extraArgs = [ "--redis-u=redis://u:p@h" ];', "--redis-u"),
])
def test_router_secret_flags_fail_evaluation_before_the_store(router, flag):
    """The one router assertion on its own fields: a secret on smg's command line would be
    written to the world-readable store before the build-time check could refuse it."""
    out = evaluate(f"{{ a = {A}; }}", f'{{ r = {{ workers = [ "a" ]; {router} }}; }}')
    assert out["failedAssertions"] == [
        f"services.sglang-dflash.routers.r.extraArgs: {flag} would put a secret in the "
        "world-readable Nix store; use apiKeyFile."]


@pytest.mark.parametrize(("router", "message"), [
    ('apiKeyFile = "/nix/store/x-key";',
     "apiKeyFile: /nix/store/x-key is in the Nix store, which every local user can read"),
])
def test_router_fields_are_the_validators_not_assertions(tmp_path, router, message):
    """No module assertion for the router's own fields: the config the module writes fails
    the build-time check (`router --config … --print-argv`) with one line naming the field."""
    out = evaluate(f"{{ a = {A}; }}", f'{{ r = {{ workers = [ "a" ]; {router} }}; }}')
    assert out["failedAssertions"] == []
    r = router_cli(tmp_path, router_json(out["services"]["sglang-dflash-router-r"]))
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sglang-dflash router: invalid config: ")
    assert message in lines[0], lines


def test_router_validator_control(tmp_path):
    """Control: the same router with a key outside the store passes that check."""
    out = evaluate(f"{{ a = {A}; }}", '{ r = { workers = [ "a" ]; apiKeyFile = "/run/k"; '
                   'environmentFile = "/run/e%i"; '
                   'extraArgs = [ "--max-payload-size" "1024" ]; }; }')
    sc = out["services"]["sglang-dflash-router-r"]["serviceConfig"]
    assert sc["EnvironmentFile"] == "/run/e%%i"  # a literal %, not a systemd specifier
    r = router_cli(tmp_path, router_json(out["services"]["sglang-dflash-router-r"]))
    assert r.returncode == 0, r.stderr
    assert "--max-payload-size" in r.stdout


@pytest.mark.parametrize(("option", "value"), [("apiKeyFile", "keys/k"),
                                               ("environmentFile", "/e\\nX=1")])
def test_router_unit_paths_are_typed_by_the_shared_pattern(option, value):
    from sglang_dflash.config import LIMITS

    if NIX is None or not LIB:
        pytest.skip("nix-instantiate or SGLANG_DFLASH_NIXPKGS_LIB is absent")
    conf = (f"{{ services.sglang-dflash.instances = {{ a = {A}; }}; "
            f'services.sglang-dflash.routers = {{ r = {{ workers = [ "a" ]; '
            f'{option} = "{value}"; }}; }}; }}')
    r = subprocess.run([NIX, "--eval", "--strict", "--json", str(EVAL), "--arg", "lib",
                        f"import {LIB}/lib", "--arg", "configuration", conf],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert (f"routers.r.{option}' is not of type `null or string matching the pattern "
            f"{LIMITS['unitPath']}'") in r.stderr, r.stderr[-2000:]


def test_router_name_is_typed_by_the_validators_pattern():
    """The router name names a unit: its option type is limits.json's instanceName (NixOS's
    own type error, not an assertion)."""
    from sglang_dflash.config import NAME_RE

    if NIX is None or not LIB:
        pytest.skip("nix-instantiate or SGLANG_DFLASH_NIXPKGS_LIB is absent")
    conf = (f"{{ services.sglang-dflash.instances = {{ a = {A}; }}; "
            'services.sglang-dflash.routers = { "r x" = { workers = [ "a" ]; }; }; }')
    r = subprocess.run([NIX, "--eval", "--strict", "--json", str(EVAL), "--arg", "lib",
                        f"import {LIB}/lib", "--arg", "configuration", conf],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert ("routers.\"r x\".name' is not of type `string matching the pattern "
            f"{NAME_RE.pattern[1:-1]}'") in r.stderr, r.stderr[-2000:]
    assert evaluate(f"{{ a = {A}; }}", '{ "r-1.b_2" = { workers = [ "a" ]; }; }')[
        "failedAssertions"] == []
