"""Router config: validation (one line naming the key and the file), the one smg argv renderer
(read back by smg's own parser), worker resolution from instance configs, and the unit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sglang_dflash.config import ConfigError
from sglang_dflash.router import (
    POLICIES,
    load_router_config,
    parse_router_config,
    render_argv,
    render_unit,
    resolve_workers,
)
from sglang_dflash.unit import UnitError, UnitOptions
from tests.conftest import REPO

BASE = {"name": "front", "workers": ["http://10.0.0.2:30000", "http://10.0.0.3:30000"]}


def rc(**changes):
    return parse_router_config({**BASE, **changes})


def test_defaults_render_loopback_metrics_and_the_workers_last():
    argv = render_argv(rc(), list(BASE["workers"]))
    assert argv[:6] == ["--host", "127.0.0.1", "--port", "30080", "--policy", "cache_aware"]
    # smg binds its Prometheus listener to 0.0.0.0 unless told: ours follows the router's host
    assert argv[argv.index("--prometheus-host") + 1] == "127.0.0.1"
    assert argv[argv.index("--prometheus-port") + 1] == "29000"
    assert argv[-3:] == ["--worker-urls", *BASE["workers"]]


def test_smg_parses_every_rendered_flag_into_its_router_args():
    smg = pytest.importorskip("smg.launch_router", reason="smg (the router extra) missing")
    cfg = rc(policy="power_of_two", host="0.0.0.0", port=8000, metrics={"port": 9100},
             healthCheck={"intervalSecs": 3, "timeoutSecs": 2, "failureThreshold": 4,
                          "successThreshold": 5, "endpoint": "/health_generate"},
             retry={"enable": False, "maxRetries": 7, "initialBackoffMs": 20,
                    "maxBackoffMs": 900},
             circuitBreaker={"enable": False}, requestTimeoutSecs=77,
             workerStartupTimeoutSecs=66, shutdownGraceSecs=9, logLevel="warn",
             extraArgs=["--max-concurrent-requests", "12"])
    a = smg.parse_router_args(render_argv(cfg, list(BASE["workers"])))
    assert (a.host, a.port, a.policy) == ("0.0.0.0", 8000, "power_of_two")
    assert (a.prometheus_host, a.prometheus_port) == ("0.0.0.0", 9100)
    assert a.worker_urls == BASE["workers"]
    assert (a.health_check_interval_secs, a.health_check_timeout_secs,
            a.health_failure_threshold, a.health_success_threshold,
            a.health_check_endpoint) == (3, 2, 4, 5, "/health_generate")
    assert (a.disable_retries, a.retry_max_retries, a.retry_initial_backoff_ms,
            a.retry_max_backoff_ms) == (True, 7, 20, 900)
    assert a.disable_circuit_breaker is True
    assert (a.request_timeout_secs, a.worker_startup_timeout_secs) == (77, 66)
    assert (a.shutdown_grace_period_secs, a.log_level, a.max_concurrent_requests) == (9, "warn", 12)
    assert a.api_key is None


def test_policies_are_the_installed_smg_choices():
    pytest.importorskip("smg.launch_router", reason="smg (the router extra) missing")
    import argparse

    from smg.router_args import RouterArgs

    p = argparse.ArgumentParser()
    RouterArgs.add_cli_args(p, use_router_prefix=False)
    (action,) = [a for a in p._actions if "--policy" in a.option_strings]
    assert set(POLICIES) == set(action.choices)
    assert RouterArgs.policy == "cache_aware" == parse_router_config(BASE).policy


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"workers": []}, "workers: must be a non-empty list"),
        ({"workers": ["10.0.0.2:30000"]}, "workers[0]: '10.0.0.2:30000' is neither"),
        ({"workers": ["http://h:30000/v1"]}, "workers[0]:"),
        ({"workers": ["http://h:0"]}, "workers[0]:"),
        ({"workers": ["http://h:1", "http://h:1"]}, "workers: lists a worker twice"),
        ({"workers": ["http://h:1\n"]}, "control characters"),
        ({"policy": "least_busy"}, "policy: 'least_busy' is not one of cache_aware"),
        ({"name": "a/b"}, "name: 'a/b' must match"),
        ({"port": 70000}, "port: 70000 is outside 1..65535"),
        ({"port": True}, "port: must be an integer, got a boolean"),
        ({"host": "-x"}, "host: '-x' is not an address"),
        ({"healthCheck": {"interval": 3}}, "healthCheck.interval: unknown key; did you mean"),
        ({"healthCheck": {"intervalSecs": 0}}, "healthCheck.intervalSecs: 0 is outside"),
        ({"healthCheck": {"endpoint": "health"}}, "healthCheck.endpoint: 'health' must be a path"),
        ({"healthCheck": {"timeoutSecs": 1}}, "healthCheck.timeoutSecs: 1 s is shorter than"),
        ({"healthCheck": {"timeoutSecs": 1, "endpoint": "/health_generate"}},
         "than SGLang 0.5.17's /health_generate"),
        ({"retry": {"maxRetries": -1}}, "retry.maxRetries: -1 is outside"),
        ({"retry": {"enable": "no"}}, "retry.enable: must be a boolean"),
        ({"circuitBreaker": {"threshold": 1}}, "circuitBreaker.threshold: unknown key"),
        ({"apiKey": "sk"}, "apiKey: inline API keys are refused"),
        ({"apiKeyFile": "key"}, "apiKeyFile: must be an absolute path"),
        ({"metrics": {"port": 30080}}, "metrics.port: 30080 is the router's own port"),
        ({"logLevel": "trace"}, "logLevel: 'trace' is not one of"),
        ({"extraArgs": ["--api-key", "x"]}, "--api-key puts a secret on the command line"),
        ({"extraArgs": ["--api-k=x"]}, "--api-k abbreviates --api-key"),
        ({"extraArgs": ["--policy", "random"]}, "--policy is rendered from a typed key"),
        ({"extraArgs": ["--worker-urls", "http://x:1"]}, "--worker-urls is rendered"),
        ({"model": "m"}, "model: unknown key"),
        ({"startTimeout": 0}, "startTimeout: 0 is outside"),
    ],
)
def test_bad_router_configs_are_one_line_naming_the_key(changes, fragment):
    with pytest.raises(ConfigError) as e:
        parse_router_config({**BASE, **changes})
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def _instance(tmp_path, name, **changes):
    raw = {"name": name, "model": "m", "algorithm": "none", "gpus": [0], "port": 31000,
           **changes}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(raw))
    return str(path)


def test_instance_configs_resolve_to_their_url_and_unit(tmp_path):
    a = _instance(tmp_path, "a", host="0.0.0.0", port=31001)
    b = _instance(tmp_path, "b", host="::", port=31002,
                  multiNode={"nnodes": 2, "nodeRank": 0, "distInitAddr": "10.0.0.1:2000"})
    ws = resolve_workers(rc(workers=[a, b, "http://10.0.0.9:30000/"]))
    assert [(w.url, w.instance) for w in ws] == [
        ("http://127.0.0.1:31001", "a"), ("http://[::1]:31002", "b"),
        ("http://10.0.0.9:30000", None)]


@pytest.mark.parametrize(
    ("changes", "router_changes", "fragment"),
    [
        ({"multiNode": {"nnodes": 2, "nodeRank": 1, "distInitAddr": "10.0.0.1:2000"}}, {},
         "is node rank 1 of a multi-node group; only rank 0 serves HTTP"),
        ({"apiKeyFile": "/run/keys/k"}, {}, "requires an API key; set the router's apiKeyFile"),
        ({"port": 0}, {}, "a.json: port: 0 is outside"),
    ],
)
def test_bad_local_workers_are_named(tmp_path, changes, router_changes, fragment):
    a = _instance(tmp_path, "a", **changes)
    with pytest.raises(ConfigError) as e:
        resolve_workers(rc(workers=[a], **router_changes))
    assert fragment in str(e.value) and str(e.value).startswith("workers[0]: ")


def test_two_entries_reaching_one_server_are_refused(tmp_path):
    a = _instance(tmp_path, "a", port=31005)
    with pytest.raises(ConfigError, match="two entries reach the same server"):
        resolve_workers(rc(workers=[a, "http://127.0.0.1:31005"]))


def test_router_unit_is_hardened_without_gpu_devices_and_orders_after_instances(tmp_path):
    from sglang_dflash.router import Worker

    cfg = rc(workers=["http://127.0.0.1:31000", "http://10.0.0.9:1"],
             apiKeyFile="/run/keys/router")
    workers = [Worker("http://127.0.0.1:31000", "a"), Worker("http://10.0.0.9:1")]
    opts = UnitOptions(package_path="/opt/sd")
    text = render_unit(cfg, workers, "/srv/sd/router.json", opts)
    lines = text.splitlines()
    assert "ExecStart=/opt/sd/bin/sglang-dflash router --config /srv/sd/router.json" in lines
    assert "After=network-online.target sglang-dflash-a.service" in lines
    assert "LoadCredential=api-key:/run/keys/router" in lines
    assert "Type=notify" in lines and "PrivateDevices=true" in lines
    assert not any(x.startswith("DeviceAllow=") for x in lines)
    assert "NoNewPrivileges=true" in lines and "CapabilityBoundingSet=" in lines
    with pytest.raises(UnitError, match="hidden from the service by PrivateTmp"):
        render_unit(cfg, workers, "/tmp/router.json", opts)
    local = rc(workers=[_instance(tmp_path, "a")])  # an instance config the sandbox hides
    with pytest.raises(UnitError, match=r"workers\[0\]: .* hidden from the service"):
        render_unit(local, resolve_workers(local), "/srv/sd/router.json", opts)


def _cli(*argv, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", "sglang_dflash", *argv], capture_output=True,
                          text=True, timeout=60, env=env, cwd=cwd)


def test_cli_bad_router_config_is_exit_2_one_line_naming_the_file(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**BASE, "policy": "nope"}))
    with pytest.raises(ConfigError, match=f"^{path}: policy"):
        load_router_config(path)
    for argv in (["router", "--config", str(path)], ["unit", "--router", "--config", str(path)]):
        r = _cli(*argv)
        assert r.returncode == 2, r
        assert len(r.stderr.strip().splitlines()) == 1 and str(path) in r.stderr, r.stderr


def test_print_argv_names_the_key_file_not_the_key(tmp_path):
    key = tmp_path / "k"
    key.write_text("sk-secret\n")
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**BASE, "apiKeyFile": str(key)}))
    r = _cli("router", "--config", str(path), "--print-argv")
    assert r.returncode == 0, r.stderr
    assert f"SGLANG_DFLASH_ROUTER_KEY_FILE={key}" in r.stdout and "sk-secret" not in r.stdout
    assert "-m sglang_dflash.router_child --host 127.0.0.1" in r.stdout


def test_missing_key_file_fails_before_starting(tmp_path):
    pytest.importorskip("smg", reason="smg (the router extra) missing")
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**BASE, "apiKeyFile": str(tmp_path / "nope")}))
    r = _cli("router", "--config", str(path))
    assert r.returncode == 2 and "apiKeyFile: cannot read" in r.stderr, r.stderr


def test_a_one_second_check_of_another_endpoint_is_the_users_choice():
    """Only SGLang's health_generate handler takes a second; a fast path may be checked at 1 s."""
    cfg = parse_router_config({**BASE, "healthCheck": {"timeoutSecs": 1, "endpoint": "/v1/models"}})
    assert ("--health-check-timeout-secs", 1) in cfg.health_check
