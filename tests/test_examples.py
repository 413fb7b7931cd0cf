"""Every shipped example config is valid, and renders what its comments promise."""

from __future__ import annotations

import json

import pytest

from sglang_dflash.config import parse_config, render_argv, render_env
from sglang_dflash.unit import UnitOptions, render_unit

from .conftest import REPO

EXAMPLES = sorted((REPO / "examples").glob("*.json"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_valid(path):
    cfg = parse_config(json.loads(path.read_text()))
    assert render_argv(cfg)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_renders_a_unit_when_copied_to_srv(path):
    """The README's `unit --config` step works for every example, not only the Hub-id one."""
    cfg = parse_config(json.loads(path.read_text()))
    text = render_unit(cfg, f"/srv/sglang-dflash/{path.name}",
                       UnitOptions(package_path="/opt/sglang-dflash"))
    assert f"serve --config /srv/sglang-dflash/{path.name}" in text


def test_tp2_example_renders_two_gpus_and_no_nvlink_multicast():
    """The two-GPU DDTree instance (issue 7): TP 2 on GPUs 0,1, NVLS/multicast off everywhere."""
    cfg = parse_config(json.loads((REPO / "examples/dummy-tp2-ddtree.json").read_text()))
    argv, env = render_argv(cfg), render_env(cfg)
    assert argv[argv.index("--tp-size") + 1] == "2"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["SGLANG_DFLASH_DDTREE_BUDGET"] == "64"
    for name, value in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                        "NVSHMEM_DISABLE_NVLS": "1"}.items():
        assert env[name] == value
