"""Sweep points are validated by the config module when present, else a minimal fallback."""

from __future__ import annotations

import importlib.util

import pytest

from sglang_dflash.bench import server

BASE = {"name": "t", "model": "m", "draftModel": "d", "algorithm": "ddtree",
        "ddtree": {"budget": 64}, "port": 31000}


def test_validate_uses_parse_config_when_present():
    if importlib.util.find_spec("sglang_dflash.config") is None:
        pytest.skip("sglang_dflash.config is not written yet; the fallback is in use")
    inst = server.validate({**BASE, "host": "0.0.0.0", "apiKeyFile": "/run/k"})
    assert inst.validator == "config.parse_config"
    assert (inst.host, inst.port, inst.api_key_file) == ("0.0.0.0", 31000, "/run/k")
    with pytest.raises(ValueError, match=r"ddtree\.budget"):
        server.validate({**BASE, "ddtree": {"budget": 0}})
    with pytest.raises(ValueError, match="unknown key"):
        server.validate({**BASE, "ddtre": {}})


@pytest.mark.parametrize("change, reason", [
    ({"model": ""}, "model"),
    ({"algorithm": "eagle"}, "algorithm"),
    ({"draftModel": None}, "draftModel"),
    ({"ddtree": {"budget": 0}}, r"ddtree\.budget"),
    ({"port": 70000}, "port"),
    ({"port": True}, "port"),
])
def test_fallback_validation_rejects(change, reason):
    with pytest.raises(ValueError, match=reason):
        server._fallback_validate({**BASE, **change})


def test_fallback_validation_defaults():
    inst = server._fallback_validate({"model": "m", "algorithm": "none"})
    assert (inst.host, inst.port, inst.validator) == ("127.0.0.1", 30000, "bench fallback")
