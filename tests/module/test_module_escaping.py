"""Review findings in the NixOS module: literal paths in unit lines as systemd reads them."""

from __future__ import annotations

import pytest

from tests.module.test_module import eval_error, evaluate

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
    """A newline would start a new directive: the option's type (limits.json's unitPath)
    refuses it at evaluation, and the validator refuses the same value."""
    from sglang_dflash.config import LIMITS, UNIT_PATH_RE, ConfigError, parse_config

    value = "/k\nExecStartPre=/bin/sh"
    err = eval_error(f'{{ a = {{ model = "m"; algorithm = "none"; '
                     f'{option} = "/k\\nExecStartPre=/bin/sh"; }}; }}')
    assert (f"instances.a.{option}' is not of type `null or string matching the pattern "
            f"{LIMITS['unitPath']}'") in err, err
    assert not UNIT_PATH_RE.match(value) and UNIT_PATH_RE.match("/k")
    if option == "apiKeyFile":
        with pytest.raises(ConfigError, match=r"^apiKeyFile: must not contain control"):
            parse_config({"name": "a", "model": "m", "algorithm": "none", option: value})
    else:  # `sglang-dflash unit --environment-file`, the same unit line on other hosts
        from sglang_dflash.unit import UnitError, UnitOptions, render_unit

        cfg = parse_config({"name": "a", "model": "m", "algorithm": "none"})
        with pytest.raises(UnitError, match=r"^--environment-file: must not contain control"):
            render_unit(cfg, "/etc/a.json", UnitOptions("/opt/s", environment_file=value))
