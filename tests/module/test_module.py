"""services.sglang-dflash evaluated with nixpkgs lib (lib.evalModules, stubbed NixOS options).

Needs SGLANG_DFLASH_NIXPKGS_LIB (a nixpkgs.lib checkout: the directory holding lib/) and
nix-instantiate. The rendered config JSON is fed through the Python parse_config, so Nix and
Python agree on the schema; the directives are compared with unit-hardening.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sglang_dflash.config import DDTREE_BUDGET_ENV, parse_config, render_argv, render_env
from sglang_dflash.unit import load_hardening
from tests.module.unit_text import as_lines, unit_directives

ROOT = Path(__file__).parents[2]
EVAL = ROOT / "tests" / "module" / "eval.nix"
NIX = shutil.which("nix-instantiate")
LIB = os.environ.get("SGLANG_DFLASH_NIXPKGS_LIB")

pytestmark = [pytest.mark.nixlib]


def _need_nix() -> None:
    if NIX is None:
        pytest.skip("nix-instantiate is not installed")


def _need_lib() -> Path:
    _need_nix()
    if not LIB:
        pytest.skip("SGLANG_DFLASH_NIXPKGS_LIB is not set (a nixpkgs.lib checkout)")
    path = Path(LIB)
    if not (path / "lib" / "default.nix").is_file():
        pytest.skip(f"SGLANG_DFLASH_NIXPKGS_LIB={LIB} has no lib/default.nix")
    return path


def evaluate(instances: str, extra: str = "") -> dict:
    lib = _need_lib()
    configuration = f"{{ services.sglang-dflash.instances = {instances}; {extra} }}"
    r = subprocess.run(
        [NIX, "--eval", "--strict", "--json", str(EVAL),
         "--arg", "lib", f"import {lib}/lib", "--arg", "configuration", configuration],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def eval_error(instances: str) -> str:
    lib = _need_lib()
    configuration = f"{{ services.sglang-dflash.instances = {instances}; }}"
    r = subprocess.run(
        [NIX, "--eval", "--strict", "--json", str(EVAL),
         "--arg", "lib", f"import {lib}/lib", "--arg", "configuration", configuration],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode != 0, r.stdout
    return r.stderr


DDTREE = '{ model = "Qwen/Qwen3-8B"; draftModel = "z-lab/Qwen3-8B-DFlash-b16"; ' \
         'algorithm = "ddtree"; ddtree.budget = 32; gpus = [ 0 ]; }'


def test_every_nix_file_parses():
    _need_nix()
    files = [*sorted(ROOT.glob("modules/**/*.nix")), *sorted(ROOT.glob("tests/**/*.nix")),
             *sorted(ROOT.glob("examples/**/*.nix"))]
    assert files
    for f in files:
        r = subprocess.run([NIX, "--parse", str(f)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"{f}: {r.stderr}"


def test_minimal_ddtree_instance_renders_a_notify_unit():
    out = evaluate(f"{{ q = {DDTREE}; }}")
    assert out["failedAssertions"] == []
    svc = out["services"]["sglang-dflash-q"]
    sc = svc["serviceConfig"]
    assert sc["Type"] == "notify"
    assert sc["DynamicUser"] is True
    exe = "/nix/store/00000000000000000000000000000000-sglang-dflash-0.1.0/bin/sglang-dflash"
    assert sc["ExecStart"].startswith(f"{exe} serve --config /nix/store/")
    # the preflight validates the very config serve is given
    config = sc["ExecStart"].removeprefix(f"{exe} serve --config ")
    assert sc["ExecStartPre"] == f"{exe} check --offline --config {config}"
    assert sc["ExecStart"].endswith("-sglang-dflash-q.json")
    assert sc["TimeoutStartSec"] == "2100s"
    assert sc["StateDirectory"] == sc["CacheDirectory"] == "sglang-dflash-q"
    assert svc["environment"]["LD_LIBRARY_PATH"] == "/run/opengl-driver/lib"
    assert svc["wantedBy"] == ["multi-user.target"]
    # the Nix-written JSON is a valid config for the one Python renderer
    cfg = parse_config(out["configs"]["q"])
    assert cfg.name == "q" and cfg.tensor_parallel_size == 1
    assert cfg.cache_dir == "/var/cache/sglang-dflash-q"
    argv = render_argv(cfg)
    assert argv[argv.index("--speculative-algorithm") + 1] == "DFLASH"
    assert render_env(cfg)[DDTREE_BUDGET_ENV] == "32"
    assert cfg.freeze_gc is True  # the module's default, serve's too


def test_every_option_reaches_config_or_unit():
    inst = """{
      full = {
        package = { type = "derivation"; name = "custom";
                    outPath = "/nix/store/cccccccccccccccccccccccccccccccc-custom"; };
        model = "/srv/models/qwen3-8b"; modelRevision = "r1";
        draftModel = "/srv/models/draft"; draftModelRevision = "r2";
        algorithm = "dflash"; ddtree.budget = 100; blockSize = 16;
        host = "0.0.0.0"; port = 31000; gpus = [ 2 3 ]; tensorParallelSize = 2;
        memFractionStatic = 0.75; attentionBackend = "triton"; draftAttentionBackend = "triton";
        contextLength = 8192; maxRunningRequests = 16; servedModelName = "qwen";
        loadFormat = "dummy"; draftLoadFormat = "dummy"; skipTokenizerInit = true;
        apiKeyFile = "/run/secrets/sglang-key"; environment = { NCCL_DEBUG = "WARN"; };
        environmentFile = "/run/secrets/sglang-env"; extraArgs = [ "--cuda-graph-max-bs" "8" ];
        openFirewall = true; preflight = false; freezeGc = false; startTimeout = 100;
        user = "sglang"; group = "gpu";
      };
      off = { enable = false; model = "m"; algorithm = "none"; gpus = [ 2 ]; port = 31000; };
    }"""
    out = evaluate(inst)
    assert out["failedAssertions"] == []
    assert list(out["services"]) == ["sglang-dflash-full"]  # disabled: no unit, no clash
    sc = out["services"]["sglang-dflash-full"]["serviceConfig"]
    assert sc["ExecStart"].startswith("/nix/store/cccccccccccccccccccccccccccccccc-custom/bin/")
    assert "ExecStartPre" not in sc  # preflight = false
    assert sc["TimeoutStartSec"] == "400s"
    assert sc["LoadCredential"] == "api-key:/run/secrets/sglang-key"
    assert sc["EnvironmentFile"] == "/run/secrets/sglang-env"
    assert sc["DynamicUser"] is False and sc["User"] == "sglang" and sc["Group"] == "gpu"
    assert out["users"]["sglang"] == {"isSystemUser": True, "group": "gpu"}
    assert "gpu" in out["groups"]
    assert out["firewall"] == [31000]
    raw = out["configs"]["full"]
    cfg = parse_config(raw)
    expected = {
        "model": "/srv/models/qwen3-8b", "model_revision": "r1", "draft_model": "/srv/models/draft",
        "draft_model_revision": "r2", "algorithm": "dflash", "block_size": 16, "host": "0.0.0.0",
        "port": 31000, "gpus": (2, 3), "tensor_parallel_size": 2, "mem_fraction_static": 0.75,
        "attention_backend": "triton", "draft_attention_backend": "triton",
        "context_length": 8192, "max_running_requests": 16, "served_model_name": "qwen",
        "load_format": "dummy", "draft_load_format": "dummy", "skip_tokenizer_init": True,
        "api_key_file": "/run/secrets/sglang-key", "environment": (("NCCL_DEBUG", "WARN"),),
        "extra_args": ("--cuda-graph-max-bs", "8"), "preflight": False, "start_timeout": 100,
        "freeze_gc": False,
    }
    for field, value in expected.items():
        assert getattr(cfg, field) == value, field
    assert cfg.ddtree.budget == 100
    # module-only options never reach the JSON (parse_config would refuse them)
    for key in ("package", "environmentFile", "openFirewall", "user", "group", "enable"):
        assert key not in raw


def test_nixos_example_evaluates_cleanly():
    lib = _need_lib()
    r = subprocess.run(
        [NIX, "--eval", "--strict", "--json", str(EVAL), "--arg", "lib", f"import {lib}/lib",
         "--arg", "configuration", f"import {ROOT / 'examples' / 'nixos.nix'}"],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["failedAssertions"] == []
    assert sorted(out["services"]) == sorted(["sglang-dflash-qwen3-8b-baseline",
                                              "sglang-dflash-qwen3-8b-dflash",
                                              "sglang-dflash-qwen3-8b-ddtree"])
    assert out["firewall"] == [30000]
    for raw in out["configs"].values():
        parse_config(raw)
    assert out["configs"]["qwen3-8b-ddtree"]["tensorParallelSize"] == 2


def test_tensor_parallel_defaults_to_gpu_count():
    out = evaluate('{ a = { model = "m"; algorithm = "none"; gpus = [ 4 5 6 7 ]; }; }')
    assert out["configs"]["a"]["tensorParallelSize"] == 4
    assert out["failedAssertions"] == []


ASSERTIONS = {
    "same-socket": (
        '{ a = { model = "m"; algorithm = "none"; gpus = [ 0 ]; }; '
        'b = { model = "m"; algorithm = "none"; gpus = [ 1 ]; }; }',
        'instances "a" and "b" both listen on 127.0.0.1:30000',
    ),
    "wildcard-socket": (
        '{ a = { model = "m"; algorithm = "none"; gpus = [ 0 ]; host = "0.0.0.0"; port = 9; }; '
        'b = { model = "m"; algorithm = "none"; gpus = [ 1 ]; port = 9; }; }',
        'instances "a" and "b" both listen on 0.0.0.0:9',
    ),
    "shared-gpu": (
        '{ a = { model = "m"; algorithm = "none"; gpus = [ 0 1 ]; }; '
        'b = { model = "m"; algorithm = "none"; gpus = [ 1 ]; port = 30001; }; }',
        'GPU 1 is used by instances "a", "b"',
    ),
}


@pytest.mark.parametrize("case", sorted(ASSERTIONS))
def test_assertion_fires_with_clear_message(case):
    """What crosses instances stays a module assertion; one instance's own values are the
    build-time validator's (tests/module/test_config_validator.py VALIDATED)."""
    instances, message = ASSERTIONS[case]
    failed = evaluate(instances)["failedAssertions"]
    assert len(failed) == 1, failed
    assert message in failed[0], failed


@pytest.mark.parametrize("budget", [0, 1024])
def test_budget_range_is_the_option_type_and_the_validators(budget):
    """The range lives in the option type (types.ints.between, from limits.json) and the
    Python validator refuses the same values: both read src/sglang_dflash/limits.json."""
    from sglang_dflash.config import ConfigError, parse_config

    err = eval_error('{ a = { model = "m"; draftModel = "d"; algorithm = "ddtree"; '
                     f'ddtree.budget = {budget}; }}; }}')
    assert "ddtree.budget' is not of type `integer between 1 and 1023 (both inclusive)'" in err
    with pytest.raises(ConfigError, match=r"ddtree\.budget"):
        parse_config({"name": "a", "model": "m", "draftModel": "d", "algorithm": "ddtree",
                         "ddtree": {"budget": budget}})


def test_instance_name_is_typed_by_the_validators_pattern():
    """The instance name's option type is limits.json's instanceName, the pattern
    sglang_dflash.config checks: NixOS refuses what the validator would refuse."""
    from sglang_dflash.config import NAME_RE

    err = eval_error('{ "a b" = { model = "m"; algorithm = "none"; }; }')
    assert ("instances.\"a b\".name' is not of type `string matching the pattern "
            f"{NAME_RE.pattern[1:-1]}'") in err
    assert not NAME_RE.match("a b")
    out = evaluate('{ "q-1.b_2" = { model = "m"; algorithm = "none"; }; }')
    assert out["failedAssertions"] == [] and NAME_RE.match("q-1.b_2")


def test_inline_api_key_is_refused_by_its_type_without_echoing_it():
    """apiKey takes no value: its type refuses one at evaluation, before any store write,
    and the message does not repeat the key. The module never writes apiKey into the JSON;
    the validator refuses the key there too (a config written by hand)."""
    from sglang_dflash.config import ConfigError

    err = eval_error('{ a = { model = "m"; algorithm = "none"; apiKey = "sk-SECRET-1"; }; }')
    assert ("The option `services.sglang-dflash.instances.a.apiKey' is refused: an inline API "
            "key would land in the world-readable Nix store; put it in a file and set "
            "apiKeyFile.") in err, err
    assert "sk-SECRET-1" not in err
    assert "apiKey" not in evaluate('{ a = { model = "m"; algorithm = "none"; }; }')[
        "configs"]["a"]
    with pytest.raises(ConfigError, match=r"^apiKey: inline API keys are refused"):
        parse_config({"name": "a", "model": "m", "algorithm": "none", "apiKey": "sk-1"})


@pytest.mark.parametrize(("option", "value"), [("apiKeyFile", "keys/k"),
                                               ("environmentFile", "env")])
def test_unit_paths_are_typed_by_the_shared_pattern(option, value):
    """apiKeyFile and environmentFile are unit lines: absolute, no control character. The
    option type is limits.json's unitPath, which the validator reads too."""
    from sglang_dflash.config import LIMITS, UNIT_PATH_RE, ConfigError

    err = eval_error(f'{{ a = {{ model = "m"; algorithm = "none"; {option} = "{value}"; }}; }}')
    assert (f"instances.a.{option}' is not of type `null or string matching the pattern "
            f"{LIMITS['unitPath']}'") in err, err
    assert not UNIT_PATH_RE.match(value) and UNIT_PATH_RE.match("/" + value)
    if option == "apiKeyFile":
        with pytest.raises(ConfigError, match=r"^apiKeyFile: must be an absolute path"):
            parse_config({"name": "a", "model": "m", "algorithm": "none", option: value})


def test_dist_init_addr_is_typed_by_the_shared_pattern():
    from sglang_dflash.config import DIST_ADDR_RE, LIMITS, ConfigError

    err = eval_error('{ a = { model = "m"; algorithm = "none"; gpus = [ 0 ]; multiNode = '
                     '{ nnodes = 2; nodeRank = 0; distInitAddr = "10.0.0.1"; }; }; }')
    assert ("multiNode.distInitAddr' is not of type `string matching the pattern "
            f"{LIMITS['distInitAddr']}'") in err, err
    assert not DIST_ADDR_RE.match("10.0.0.1")
    with pytest.raises(ConfigError, match=r"^multiNode\.distInitAddr: '10\.0\.0\.1' is not"):
        parse_config({"name": "a", "model": "m", "algorithm": "none", "gpus": [0],
                      "multiNode": {"nnodes": 2, "nodeRank": 0, "distInitAddr": "10.0.0.1"}})
    out = evaluate('{ a = { model = "m"; algorithm = "none"; gpus = [ 0 ]; multiNode = '
                   '{ nnodes = 2; nodeRank = 0; distInitAddr = "[fd00::1]:20000"; }; }; }')
    assert out["failedAssertions"] == []
    assert DIST_ADDR_RE.match("[fd00::1]:20000")
    assert parse_config(out["configs"]["a"]).multi_node.dist_init_addr == "[fd00::1]:20000"


def test_gpu_listed_twice_in_one_instance():
    failed = evaluate('{ a = { model = "m"; algorithm = "none"; gpus = [ 2 2 ]; }; }')[
        "failedAssertions"]
    assert failed == ["services.sglang-dflash: GPU 2 is listed 2 times in instances.a.gpus; "
                      "a GPU belongs to one instance, once."]


def test_wrong_option_type_fails_evaluation():
    err = eval_error('{ a = { model = "m"; algorithm = "none"; port = "80"; }; }')
    assert "port" in err and "not of type" in err
    err = eval_error('{ a = { model = "m"; algorithm = "eagle"; }; }')
    assert "algorithm" in err


def test_module_directives_are_the_shared_hardening_file():
    out = evaluate(f"{{ q = {DDTREE}; }}")
    svc = out["services"]["sglang-dflash-q"]
    shared = load_hardening()
    for entry in shared["lifecycle"] + shared["hardening"]:
        assert svc["serviceConfig"][entry["key"]] == entry["value"], entry["key"]
    assert svc["unitConfig"] == {e["key"]: e["value"] for e in shared["unit"]}


def test_module_and_unit_command_render_the_same_unit(tmp_path):
    """Same instance through both renderers: every [Service]/[Unit] directive agrees."""
    from sglang_dflash.unit import UnitOptions, render_unit

    out = evaluate(f"{{ q = {DDTREE}; }}")
    svc = out["services"]["sglang-dflash-q"]
    cfg = parse_config(out["configs"]["q"])
    text = render_unit(cfg, "/etc/sglang-dflash/q.json",
                       UnitOptions(package_path="/nix/store/00000000000000000000000000000000-"
                                   "sglang-dflash-0.1.0"))
    rendered = unit_directives(text)
    # config path / %S spelling differ by design
    skip = {"ExecStart", "ExecStartPre", "WorkingDirectory"}
    for key, value in {**svc["serviceConfig"], **svc["unitConfig"]}.items():
        if key not in skip:
            assert rendered.get(key) == as_lines(value), key
    assert rendered["ExecStart"][0].endswith("serve --config /etc/sglang-dflash/q.json")
    nix_config = svc["serviceConfig"]["ExecStart"].split(" serve --config ")[1]
    assert [line.replace("/etc/sglang-dflash/q.json", nix_config)
            for line in rendered["ExecStartPre"]] == [svc["serviceConfig"]["ExecStartPre"]]
    assert rendered["After"] == [" ".join(svc["after"])]
    assert rendered["Wants"] == [" ".join(svc["wants"])]
    assert rendered["WantedBy"] == svc["wantedBy"]
    env = {v.strip('"').split("=", 1)[0]: v.strip('"').split("=", 1)[1]
           for v in rendered["Environment"]}
    for key, value in svc["environment"].items():
        if key != "HOME":
            assert env[key] == value, key


def test_vm_test_instance_renders_the_expected_unit():
    """The VM test's instance (pkgs/checks/vm-standin.nix, not runnable here) passes every
    assertion and renders the notify unit that test expects, with the stand-in's settings."""
    instance = ROOT / "pkgs" / "checks" / "vm-standin-instance.nix"
    pkg = ('{ type = "derivation"; name = "standin"; '
           'outPath = "/nix/store/22222222222222222222222222222222-standin"; }')
    out = evaluate(f"{{ standin = import {instance} {pkg}; }}")
    assert out["failedAssertions"] == []
    svc = out["services"]["sglang-dflash-standin"]
    sc = svc["serviceConfig"]
    assert sc["Type"] == "notify" and sc["DynamicUser"] is True and "ExecStartPre" not in sc
    assert sc["ExecStart"].startswith("/nix/store/22222222222222222222222222222222-standin/bin/")
    assert sc["ProtectSystem"] == "strict" and sc["PrivateTmp"] is True
    cfg = out["configs"]["standin"]
    assert cfg["environment"]["STANDIN_SELFKILL_ON_TERM"] == "1"
    assert (cfg["host"], cfg["port"], cfg["algorithm"]) == ("127.0.0.1", 30000, "ddtree")


def test_ddtree_policy_reaches_the_config_and_bad_text_is_a_type_error():
    """`ddtree.policy` is written to the instance config (the build-time validator parses it
    with the worker's parser); text that is neither fixed nor adaptive… fails NixOS's type."""
    out = evaluate('{ q = { model = "m"; draftModel = "d"; algorithm = "ddtree"; '
                   'ddtree.budget = 16; ddtree.policy = "adaptive:auto:256"; gpus = [ 0 ]; }; }')
    assert out["failedAssertions"] == []
    cfg = parse_config(out["configs"]["q"])
    assert cfg.ddtree.policy == "adaptive:auto:256"
    assert render_env(cfg)["SGLANG_DFLASH_DDTREE_POLICY"] == "adaptive:auto:256"
    default = evaluate('{ q = { model = "m"; draftModel = "d"; algorithm = "ddtree"; }; }')
    assert default["configs"]["q"]["ddtree"] == {"budget": 64, "policy": "fixed"}
    err = eval_error('{ a = { model = "m"; draftModel = "d"; algorithm = "ddtree"; '
                     'ddtree.policy = "sometimes"; }; }')
    assert "ddtree.policy' is not of type `string matching the pattern" in err
