"""Review findings in the NixOS module: literal paths in unit lines as systemd reads them."""

from __future__ import annotations

import pytest

from tests.module.test_module import evaluate

pytestmark = [pytest.mark.nixlib]


def test_specifiers_in_literal_paths_are_escaped():
    out = evaluate('{ a = { model = "m"; algorithm = "none"; apiKeyFile = "/run/keys/50%i"; '
                   'environmentFile = "/etc/env%h"; }; }')
    assert out["failedAssertions"] == []
    service = out["services"]["sglang-dflash-a"]["serviceConfig"]
    assert service["LoadCredential"] == "api-key:/run/keys/50%%i"
    assert service["EnvironmentFile"] == "/etc/env%%h"


@pytest.mark.parametrize("option", ["apiKeyFile", "environmentFile"])
def test_newline_in_a_unit_path_is_refused(option):
    out = evaluate(f'{{ a = {{ model = "m"; algorithm = "none"; '
                   f'{option} = "/k\\nExecStartPre=/bin/sh"; }}; }}')
    failed = out["failedAssertions"]
    assert len(failed) == 1 and "control characters" in failed[0], failed
