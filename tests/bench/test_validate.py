"""Sweep points are validated by the config module, the one validator."""

from __future__ import annotations

import pytest

from sglang_dflash.bench import server

BASE = {"name": "t", "model": "m", "draftModel": "d", "algorithm": "ddtree",
        "ddtree": {"budget": 64}, "port": 31000}


def test_validate_uses_parse_config():
    inst = server.validate({**BASE, "host": "0.0.0.0", "apiKeyFile": "/run/k"})
    assert (inst.host, inst.port, inst.api_key_file) == ("0.0.0.0", 31000, "/run/k")


@pytest.mark.parametrize("change, reason", [
    ({"model": ""}, "model"),
    ({"algorithm": "eagle"}, "algorithm"),
    ({"draftModel": None}, "draftModel"),
    ({"ddtree": {"budget": 0}}, r"ddtree\.budget"),
    ({"port": 70000}, "port"),
    ({"port": True}, "port"),
    ({"ddtre": {}}, "unknown key"),
])
def test_validation_rejects(change, reason):
    with pytest.raises(ValueError, match=reason):
        server.validate({**BASE, **change})
