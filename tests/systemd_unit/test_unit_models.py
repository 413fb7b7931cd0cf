"""`sglang-dflash unit --models`: the model loader unit for non-NixOS hosts, and the server
unit's Requires=/After= on it."""

from __future__ import annotations

import json
import shutil

import pytest

from sglang_dflash.config import parse_config
from sglang_dflash.unit import UnitError, UnitOptions, render_models_unit, render_unit
from tests.systemd_unit.systemd_tools import analyze_verify, package_prefix
from tests.systemd_unit.test_unit import run_cli, unit_lines

SHA = "0123456789abcdef0123456789abcdef01234567"
PINNED = {"name": "qwen", "model": "Qwen/Qwen3-8B", "modelRevision": SHA,
          "draftModel": "/srv/models/draft", "algorithm": "ddtree", "gpus": [0]}
CONFIG = "/etc/sglang-dflash/qwen.json"
EXE = "/nix/var/nix/profiles/sglang-dflash/bin/sglang-dflash"


def test_server_requires_the_loader_of_a_pinned_hub_model():
    lines = unit_lines(render_unit(parse_config(PINNED), CONFIG, UnitOptions()))
    assert lines["Requires"] == ["sglang-dflash-qwen-models.service"]
    assert lines["After"] == [
        "network-online.target nvidia-persistenced.service sglang-dflash-qwen-models.service"]
    off = unit_lines(render_unit(parse_config(PINNED), CONFIG, UnitOptions(fetch_models=False)))
    assert "Requires" not in off
    unpinned = unit_lines(render_unit(parse_config({**PINNED, "modelRevision": "main"}),
                                      CONFIG, UnitOptions()))
    assert "Requires" not in unpinned


def test_loader_unit():
    text = render_models_unit(parse_config(PINNED), CONFIG,
                              UnitOptions(environment_file="/etc/sglang/hf.env"))
    lines = unit_lines(text)
    assert lines["Type"] == ["oneshot"] and lines["RemainAfterExit"] == ["true"]
    assert lines["Restart"] == ["on-failure"] and lines["StartLimitBurst"] == ["3"]
    assert lines["ExecStart"] == [f"{EXE} fetch-models --config {CONFIG}"]
    assert lines["Before"] == ["sglang-dflash-qwen.service"]
    assert lines["DynamicUser"] == ["true"] and lines["User"] == ["sglang-dflash-qwen"]
    assert lines["CacheDirectory"] == ["sglang-dflash-qwen"]
    assert "RuntimeDirectory" not in lines and "DeviceAllow" not in lines
    assert lines["PrivateDevices"] == ["true"] and lines["ProtectSystem"] == ["strict"]
    assert lines["EnvironmentFile"] == ["/etc/sglang/hf.env"]
    assert lines["WantedBy"] == ["sglang-dflash-qwen.service"]
    static = unit_lines(render_models_unit(parse_config(PINNED), CONFIG, UnitOptions(user="llm")))
    assert "DynamicUser" not in static and static["User"] == ["llm"]


def test_loader_of_an_instance_with_nothing_to_fetch_is_refused():
    with pytest.raises(UnitError, match="has no model to fetch ahead"):
        render_models_unit(parse_config({**PINNED, "modelRevision": None}), CONFIG,
                           UnitOptions())


def test_cli_renders_the_loader_and_refuses_bad_combinations(visible_tmp):
    config = visible_tmp / "qwen.json"
    config.write_text(json.dumps(PINNED))
    r = run_cli("--config", str(config), "--models")
    assert r.returncode == 0, r.stderr
    assert "fetch-models --config " + str(config) in r.stdout
    r = run_cli("--config", str(config), "--no-fetch-models")
    assert r.returncode == 0 and "Requires=" not in r.stdout
    r = run_cli("--config", str(config), "--models", "--router")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "contradict" in r.stderr
    config.write_text(json.dumps({**PINNED, "modelRevision": "main"}))
    r = run_cli("--config", str(config), "--models")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "has no model to fetch ahead" in r.stderr


def test_systemd_analyze_verify_accepts_the_loader(tmp_path, visible_tmp):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    prefix = visible_tmp / "prefix"
    package_prefix(prefix)
    unit = tmp_path / "sglang-dflash-qwen-models.service"
    unit.write_text(render_models_unit(parse_config(PINNED), CONFIG,
                                       UnitOptions(package_path=str(prefix))))
    rc, problems, output = analyze_verify(unit, tmp_path)
    assert rc == 0, output
    assert problems == []
