"""Instance config for scaling out (issue 17): multiNode and metrics, validated and rendered
by the one argv renderer; every bad value is one line naming the key (and the file)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_dflash.config import ConfigError, load_config, parse_config, render_argv

BASE = {"name": "big", "model": "/srv/models/m", "algorithm": "none", "gpus": [0, 1]}
MN = {"nnodes": 2, "nodeRank": 0, "distInitAddr": "10.0.0.1:20000"}


def cfg(**changes):
    raw = copy.deepcopy(BASE)
    raw.update(changes)
    return raw


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_multi_node_renders_its_three_flags_and_tp_across_nodes():
    argv = render_argv(parse_config(cfg(multiNode={**MN, "nodeRank": 1})))
    assert flag(argv, "--nnodes") == "2"
    assert flag(argv, "--node-rank") == "1"
    assert flag(argv, "--dist-init-addr") == "10.0.0.1:20000"
    assert flag(argv, "--tp-size") == "4"  # 2 GPUs here x 2 nodes, the default


def test_one_node_renders_no_multi_node_flags_and_no_metrics_by_default():
    argv = render_argv(parse_config(cfg()))
    for f in ("--nnodes", "--node-rank", "--dist-init-addr", "--enable-metrics"):
        assert f not in argv
    assert render_argv(parse_config(cfg(multiNode=None, metrics={"enable": False}))) == argv


def test_metrics_enable_renders_enable_metrics():
    assert "--enable-metrics" in render_argv(parse_config(cfg(metrics={"enable": True})))


@pytest.mark.parametrize("addr", ["10.0.0.1:20000", "node0.cluster:1", "[fd00::1]:29500"])
def test_dist_init_addr_forms(addr):
    c = parse_config(cfg(multiNode={**MN, "distInitAddr": addr}))
    assert c.multi_node.dist_init_addr == addr


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"multiNode": {**MN, "nodeRank": 2}}, "multiNode.nodeRank: 2 must be in 0..1"),
        ({"multiNode": {**MN, "nodeRank": -1}}, "multiNode.nodeRank: -1 must be in 0..1"),
        ({"multiNode": {**MN, "nnodes": 1}}, "multiNode.nnodes: 1 is outside 2.."),
        ({"multiNode": {**MN, "nnodes": True}}, "multiNode.nnodes: must be an integer"),
        ({"multiNode": {**MN, "distInitAddr": "10.0.0.1"}}, "multiNode.distInitAddr: '10.0.0.1'"),
        ({"multiNode": {**MN, "distInitAddr": "h:0"}}, "is not host:port"),
        ({"multiNode": {**MN, "distInitAddr": "h:70000"}}, "is not host:port"),
        ({"multiNode": {**MN, "distInitAddr": "-h:1"}}, "is not host:port"),
        ({"multiNode": {**MN, "distInitAddr": "a b:1"}}, "is not host:port"),
        ({"multiNode": {"nnodes": 2, "nodeRank": 0}}, "multiNode.distInitAddr: required"),
        ({"multiNode": {**MN, "node_rank": 0}},
         "multiNode.node_rank: unknown key; did you mean 'nodeRank'"),
        ({"multiNode": [2, 0]}, "multiNode: must be an object"),
        ({"multiNode": {**MN, "nnodes": 3}, "tensorParallelSize": 4},
         "tensorParallelSize: 4 is not divisible by multiNode.nnodes = 3"),
        ({"multiNode": MN, "tensorParallelSize": 2},
         "tensorParallelSize: 2 does not match the 2 GPU(s) in gpus [0, 1] x 2 nodes"),
        ({"metrics": {"enabled": True}}, "metrics.enabled: unknown key; did you mean 'enable'"),
        ({"metrics": {"enable": "yes"}}, "metrics.enable: must be a boolean"),
        ({"metrics": True}, "metrics: must be an object"),
        ({"extraArgs": ["--enable-metrics"]}, "--enable-metrics is rendered from a typed key"),
        ({"extraArgs": ["--nnodes", "2"]}, "--nnodes is rendered from a typed key"),
        ({"extraArgs": ["--node-rank=1"]}, "--node-rank is rendered from a typed key"),
        ({"extraArgs": ["--nccl-init-addr", "h:1"]}, "--nccl-init-addr is rendered"),
        ({"extraArgs": ["--dist-init", "h:1"]}, "--dist-init abbreviates --dist-init-addr"),
    ],
)
def test_bad_scaleout_values_are_one_line_naming_the_key(changes, fragment):
    with pytest.raises(ConfigError) as e:
        parse_config(cfg(**changes))
    msg = str(e.value)
    assert fragment in msg
    assert "\n" not in msg


def test_the_file_is_named_and_the_cli_exits_2_in_one_line(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps(cfg(multiNode={**MN, "nodeRank": 5})))
    with pytest.raises(ConfigError, match=f"^{path}: multiNode.nodeRank"):
        load_config(path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    for sub in ("serve", "unit"):
        r = subprocess.run([sys.executable, "-m", "sglang_dflash", sub, "--config", str(path)],
                           capture_output=True, text=True, timeout=30, env=env)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert str(path) in r.stderr and "multiNode.nodeRank" in r.stderr


def _sglang_python() -> Path | None:
    venv = os.environ.get("SGLANG_DFLASH_SGLANG_SITE", "").strip()
    py = Path(venv) / "bin" / "python" if venv else None
    return py if py is not None and py.exists() else None


def test_sglang_0517_parses_the_rendered_scaleout_flags():
    """The real ServerArgs parser (SGLang CPU env, tests/overlay/install_sglang_cpu.sh) reads
    the flags we render into the fields it uses; an unknown flag would make argparse exit 2."""
    py = _sglang_python()
    if py is None:
        pytest.skip("no SGLang CPU env (set SGLANG_DFLASH_SGLANG_SITE; .ci/run builds one)")
    argv = render_argv(parse_config(cfg(multiNode={**MN, "nodeRank": 1},
                                        metrics={"enable": True})))
    code = (
        "import argparse, json, sys\n"
        "from sglang.srt.server_args import ServerArgs\n"
        "p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)\n"
        "a = p.parse_args(sys.argv[1:])\n"
        "print(json.dumps([a.nnodes, a.node_rank, a.dist_init_addr, a.enable_metrics,"
        " a.tp_size]))\n"
    )
    r = subprocess.run([str(py), "-c", code, *argv], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [2, 1, "10.0.0.1:20000", True, 4]
