"""services.sglang-dflash: the model loader unit (fetchModels) and `offline`, evaluated with
nixpkgs lib as in test_module.py; the loader agrees with `sglang-dflash unit --models`."""

from __future__ import annotations

import pytest

from sglang_dflash.config import parse_config, render_env
from sglang_dflash.unit import UnitOptions, load_hardening, render_models_unit
from tests.module.test_module import DDTREE, eval_error, evaluate
from tests.module.unit_text import as_lines, unit_directives

pytestmark = [pytest.mark.nixlib]

SHA = "0123456789abcdef0123456789abcdef01234567"
SHA2 = "fedcba9876543210fedcba9876543210fedcba98"
PINNED_KEYS = ('model = "Qwen/Qwen3-8B"; modelRevision = "' + SHA + '"; '
               'draftModel = "z-lab/Qwen3-8B-DFlash-b16"; draftModelRevision = "' + SHA2 + '";')
PINNED = "{ " + PINNED_KEYS + " gpus = [ 0 ]; }"
EXE = "/nix/store/00000000000000000000000000000000-sglang-dflash-0.1.0/bin/sglang-dflash"


def test_pinned_hub_models_get_a_loader_before_the_server():
    out = evaluate(f"{{ q = {PINNED}; }}")
    assert out["failedAssertions"] == []
    server = out["services"]["sglang-dflash-q"]
    loader = out["services"]["sglang-dflash-q-models"]
    assert server["requires"] == ["sglang-dflash-q-models.service"]
    assert server["after"][-1] == "sglang-dflash-q-models.service"
    assert loader["before"] == ["sglang-dflash-q.service"]
    sc = loader["serviceConfig"]
    config = server["serviceConfig"]["ExecStart"].removeprefix(f"{EXE} serve --config ")
    assert sc["ExecStart"] == f"{EXE} fetch-models --config {config}"
    assert sc["Type"] == "oneshot" and sc["RemainAfterExit"] is True
    assert sc["Restart"] == "on-failure"
    assert loader["unitConfig"]["StartLimitBurst"] == "3"
    # the server's user and cache; no GPU devices, no runtime directory of its own
    assert sc["DynamicUser"] is True and sc["User"] == "sglang-dflash-q"
    assert sc["CacheDirectory"] == server["serviceConfig"]["CacheDirectory"] == "sglang-dflash-q"
    assert sc["PrivateDevices"] is True and sc["DeviceAllow"] == []
    assert "RuntimeDirectory" not in sc
    assert "wantedBy" not in loader or loader["wantedBy"] == []
    shared = load_hardening()
    for entry in shared["modelsLifecycle"]:
        assert sc[entry["key"]] == entry["value"], entry["key"]
    # the server runs offline against that cache
    cfg = parse_config(out["configs"]["q"])
    assert cfg.offline is True
    env = render_env(cfg)
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["HF_HOME"] == "/var/cache/sglang-dflash-q/huggingface"


def test_no_loader_for_unpinned_or_local_models_or_when_off():
    out = evaluate(f'{{ u = {DDTREE}; l = {{ model = "/srv/m"; draftModel = "/srv/d"; '
                   'gpus = [ 1 ]; port = 30001; }; '
                   f'o = {{ {PINNED_KEYS} fetchModels = false; gpus = [ 2 ]; port = 30002; }}; }}')
    assert out["failedAssertions"] == []
    assert set(out["services"]) == {"sglang-dflash-u", "sglang-dflash-l", "sglang-dflash-o"}
    for name in ("u", "l", "o"):
        assert out["services"][f"sglang-dflash-{name}"].get("requires", []) == []
    assert parse_config(out["configs"]["u"]).offline is False
    assert parse_config(out["configs"]["l"]).offline is True  # local paths serve offline
    assert out["configs"]["o"]["offline"] is None  # null: the validator derives it


def test_static_user_and_environment_file_reach_the_loader():
    out = evaluate(f'{{ q = {PINNED[:-1]} user = "llm"; environmentFile = "/run/s/hf"; }}; }}')
    sc = out["services"]["sglang-dflash-q-models"]["serviceConfig"]
    assert sc["DynamicUser"] is False and sc["User"] == "llm" and sc["Group"] == "llm"
    assert sc["EnvironmentFile"] == "/run/s/hf"


def test_offline_true_with_an_unpinned_hub_id_is_the_validators_refusal():
    """No module assertion: the config the module writes says offline = true with an
    unpinned hub id, and the validator (the build-time check) refuses it with one line."""
    from sglang_dflash.config import ConfigError

    out = evaluate(f'{{ q = {DDTREE[:-1]} offline = true; }}; }}')
    assert out["failedAssertions"] == []
    raw = out["configs"]["q"]
    assert raw["offline"] is True and raw["modelRevision"] is None
    with pytest.raises(ConfigError, match=r"^modelRevision: offline serving of hub id "
                       r"'Qwen/Qwen3-8B' needs a pinned commit \(40 hex digits\), got not set$"):
        parse_config(raw)
    out = evaluate(f'{{ q = {PINNED[:-1]} environment.HF_HUB_OFFLINE = "0"; }}; }}')
    assert out["failedAssertions"] == []
    with pytest.raises(ConfigError, match=r"^environment\.HF_HUB_OFFLINE: set `offline` instead$"):
        parse_config(out["configs"]["q"])
    assert "offline" in eval_error('{ q = { model = "m"; offline = "yes"; }; }')


def test_pinned_means_the_shared_pattern():
    """Nix's fetchModels default and the validator's is_pinned read limits.json's
    pinnedRevision: a 40-hex commit gets the loader, 40 upper-case hex digits do not."""
    from sglang_dflash.config import is_pinned

    upper = SHA.upper()
    out = evaluate('{ q = { model = "Qwen/Qwen3-8B"; modelRevision = "' + upper + '"; '
                   'algorithm = "none"; }; r = { model = "Qwen/Qwen3-8B"; modelRevision = "'
                   + SHA + '"; algorithm = "none"; gpus = [ 1 ]; port = 30001; }; }')
    assert "sglang-dflash-q-models" not in out["services"] and not is_pinned(upper)
    assert "sglang-dflash-r-models" in out["services"] and is_pinned(SHA)
    assert parse_config(out["configs"]["q"]).offline is False
    assert parse_config(out["configs"]["r"]).offline is True


def test_module_and_unit_command_render_the_same_loader():
    out = evaluate(f"{{ q = {PINNED}; }}")
    svc = out["services"]["sglang-dflash-q-models"]
    cfg = parse_config(out["configs"]["q"])
    text = render_models_unit(cfg, "/etc/sglang-dflash/q.json",
                              UnitOptions(package_path=EXE.removesuffix("/bin/sglang-dflash")))
    rendered = unit_directives(text)
    for key, value in {**svc["serviceConfig"], **svc["unitConfig"]}.items():
        if key not in {"ExecStart", "WorkingDirectory"}:
            assert rendered.get(key, []) == as_lines(value), key
    assert rendered["ExecStart"] == [f"{EXE} fetch-models --config /etc/sglang-dflash/q.json"]
    assert rendered["After"] == [" ".join(svc["after"])]
    assert rendered["Before"] == svc["before"]
