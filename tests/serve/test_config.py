"""Instance config: validation (one-line errors naming the key) and the one argv renderer."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from sglang_dflash.config import (
    DDTREE_BUDGET_ENV,
    KNOWN_KEYS,
    ConfigError,
    load_config,
    parse_config,
    render_argv,
    render_env,
)

BASE = {
    "name": "q",
    "model": "Qwen/Qwen3-8B",
    "draftModel": "z-lab/Qwen3-8B-DFlash-b16",
    "algorithm": "ddtree",
    "ddtree": {"budget": 32},
    "gpus": [2, 3],
}


def cfg_with(**changes):
    raw = copy.deepcopy(BASE)
    raw.update(changes)
    return raw


def flag_value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


@pytest.mark.parametrize(
    ("raw", "key", "fragment"),
    [
        (cfg_with(bogus=1), "bogus", "unknown key"),
        (cfg_with(port="80"), "port", "must be an integer"),
        (cfg_with(port=True), "port", "got a boolean"),
        (cfg_with(port=70000), "port", "outside 1..65535"),
        (cfg_with(ddtree={"budget": 0}), "ddtree.budget", "outside 1..1023"),
        (cfg_with(ddtree={"budget": 1024}), "ddtree.budget", "outside 1..1023"),
        (cfg_with(ddtree={"budget": 8, "width": 2}), "ddtree.width", "unknown key"),
        (cfg_with(ddtree=5), "ddtree", "must be an object"),
        (cfg_with(draftModel=None), "draftModel", "needs a draft model"),
        (cfg_with(algorithm="eagle"), "algorithm", "not one of"),
        (cfg_with(tensorParallelSize=1), "tensorParallelSize", "does not match"),
        (cfg_with(gpus=[1, 1], tensorParallelSize=2), "gpus", "twice"),
        (cfg_with(gpus=[-1]), "gpus[0]", "non-negative"),
        (cfg_with(gpus="0"), "gpus", "must be a list"),
        (cfg_with(apiKey="sk-123"), "apiKey", "apiKeyFile"),
        (cfg_with(extraArgs=["--api-key", "x"]), "extraArgs", "apiKeyFile"),
        (cfg_with(extraArgs=["--api-key=x"]), "extraArgs", "apiKeyFile"),
        (cfg_with(extraArgs=["--config", "a.yaml"]), "extraArgs", "reserved"),
        (cfg_with(extraArgs=["--port", "1"]), "extraArgs", "typed key"),
        (cfg_with(extraArgs=[1]), "extraArgs", "list of strings"),
        (cfg_with(apiKeyFile="key.txt"), "apiKeyFile", "absolute"),
        (cfg_with(memFractionStatic=1.0), "memFractionStatic", "(0, 1)"),
        (cfg_with(environment={"CUDA_VISIBLE_DEVICES": "0"}), "environment.CUDA_VISIBLE_DEVICES",
         "gpus"),
        (cfg_with(environment={DDTREE_BUDGET_ENV: "3"}), f"environment.{DDTREE_BUDGET_ENV}",
         "ddtree.budget"),
        (cfg_with(environment={"A": 1}), "environment.A", "must be a string"),
        (cfg_with(name="a/b"), "name", "must match"),
        (cfg_with(startTimeout=0), "startTimeout", "outside"),
        (cfg_with(preflight="yes"), "preflight", "boolean"),
        (cfg_with(freezeGc="yes"), "freezeGc", "boolean"),
        (cfg_with(freezeGc=None), "freezeGc", "must be set"),
        ({"name": "x"}, "model", "required"),
        ([], "config", "JSON object"),
    ],
)
def test_bad_configs_fail_with_one_line_naming_the_key(raw, key, fragment):
    with pytest.raises(ConfigError) as exc:
        parse_config(raw)
    msg = str(exc.value)
    assert msg.startswith(f"{key}:"), msg
    assert fragment in msg
    assert "\n" not in msg


def test_parse_config_is_pure_and_overrides_revalidate():
    raw = cfg_with()
    before = copy.deepcopy(raw)
    cfg = parse_config(raw)
    assert raw == before
    assert cfg.ddtree.budget == 32 and cfg.tensor_parallel_size == 2
    # what the bench tool does: dotted overrides on the raw dict, then parse again
    raw["ddtree"]["budget"] = 64
    raw["algorithm"] = "none"
    again = parse_config(raw)
    assert again.algorithm == "none" and again.ddtree.budget == 64
    raw["ddtree"]["budget"] = 5000
    with pytest.raises(ConfigError, match=r"^ddtree.budget:"):
        parse_config(raw)


def test_ddtree_renders_dflash_plus_budget_env():
    cfg = parse_config(cfg_with(blockSize=16, draftModelRevision="abc", modelRevision="r1"))
    argv = render_argv(cfg)
    assert flag_value(argv, "--speculative-algorithm") == "DFLASH"
    assert flag_value(argv, "--speculative-draft-model-path") == "z-lab/Qwen3-8B-DFlash-b16"
    assert flag_value(argv, "--speculative-dflash-block-size") == "16"
    assert flag_value(argv, "--speculative-draft-model-revision") == "abc"
    assert flag_value(argv, "--revision") == "r1"
    assert flag_value(argv, "--tp-size") == "2"
    env = render_env(cfg)
    assert env[DDTREE_BUDGET_ENV] == "32"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"


@pytest.mark.parametrize("env,extra,fragment", [
    # the bound with FlashInfer named by the typed key, by extraArgs in both spellings
    ({"SGLANG_DFLASH_DDTREE_HOST_LENS": "bound"}, {"attentionBackend": "flashinfer"},
     "SGLANG_DFLASH_DDTREE_HOST_LENS=bound with FlashInfer attention"),
    ({"SGLANG_DFLASH_DDTREE_HOST_LENS": "bound"},
     {"extraArgs": ["--speculative-draft-attention-backend", "flashinfer"]},
     "SGLANG_DFLASH_DDTREE_HOST_LENS=bound with FlashInfer attention"),
    ({"SGLANG_DFLASH_DDTREE_HOST_LENS": "bound"}, {"extraArgs": ["--attention-backend=flashinfer"]},
     "SGLANG_DFLASH_DDTREE_HOST_LENS=bound with FlashInfer attention"),
    ({"SGLANG_DFLASH_DDTREE_HOST_LENS": "later"}, {}, "SGLANG_DFLASH_DDTREE_HOST_LENS='later'"),
    ({"SGLANG_DFLASH_DDTREE_FAST_PLAN": "yes"}, {}, "SGLANG_DFLASH_DDTREE_FAST_PLAN='yes'"),
    ({"SGLANG_DFLASH_DDTREE_SPLIT_VERIFY": "2"}, {}, "SGLANG_DFLASH_DDTREE_SPLIT_VERIFY='2'"),
    ({"SGLANG_DFLASH_DDTREE_NODRAFT_STEPS": "99"}, {}, "outside 1..64"),
])
def test_ddtree_switches_in_environment_are_judged_as_the_launcher_judges_them(env, extra,
                                                                              fragment):
    with pytest.raises(ConfigError) as exc:
        parse_config(cfg_with(environment=env, **extra))
    msg = str(exc.value)
    assert msg.startswith("environment: ") and fragment in msg and "\n" not in msg


def test_ddtree_switches_that_hold_pass_and_other_algorithms_ignore_them():
    bound = {"SGLANG_DFLASH_DDTREE_HOST_LENS": "bound"}
    assert parse_config(cfg_with(environment=bound, attentionBackend="triton")).environment
    # the padded verify: FlashInfer target, the drafter on Triton (typed key or extraArgs)
    assert parse_config(cfg_with(environment=bound, attentionBackend="flashinfer",
                                 draftAttentionBackend="triton")).environment
    assert parse_config(cfg_with(environment=bound, attentionBackend="flashinfer", extraArgs=[
        "--speculative-draft-attention-backend=triton"])).environment
    assert parse_config(cfg_with(environment={"SGLANG_DFLASH_DDTREE_HOST_LENS": "sync"},
                                 attentionBackend="flashinfer")).environment
    dflash = cfg_with(environment=bound, attentionBackend="flashinfer", algorithm="dflash")
    dflash.pop("ddtree")
    assert parse_config(dflash).algorithm == "dflash"  # DFLASH reads none of them


def test_dflash_has_no_budget_and_none_has_no_speculation():
    dflash = parse_config(cfg_with(algorithm="dflash"))
    assert flag_value(render_argv(dflash), "--speculative-algorithm") == "DFLASH"
    assert DDTREE_BUDGET_ENV not in render_env(dflash)
    none = parse_config(cfg_with(algorithm="none", draftModel=None))
    assert not [a for a in render_argv(none) if a.startswith("--speculative")]
    assert DDTREE_BUDGET_ENV not in render_env(none)


def test_every_typed_key_renders():
    raw = cfg_with(
        host="0.0.0.0", port=31000, memFractionStatic=0.7, attentionBackend="triton",
        draftAttentionBackend="triton", contextLength=4096, maxRunningRequests=8,
        servedModelName="qwen", loadFormat="dummy", draftLoadFormat="dummy",
        skipTokenizerInit=True, extraArgs=["--cuda-graph-max-bs", "8"],
        environment={"NCCL_DEBUG": "WARN"}, cacheDir="/var/cache/x",
    )
    argv = render_argv(parse_config(raw))
    expected = {
        "--model-path": "Qwen/Qwen3-8B", "--host": "0.0.0.0", "--port": "31000",
        "--mem-fraction-static": "0.7", "--attention-backend": "triton",
        "--speculative-draft-attention-backend": "triton", "--context-length": "4096",
        "--max-running-requests": "8", "--served-model-name": "qwen", "--load-format": "dummy",
        "--speculative-draft-load-format": "dummy",
    }
    for flag, value in expected.items():
        assert flag_value(argv, flag) == value, flag
    assert "--skip-tokenizer-init" in argv
    assert argv[-2:] == ["--cuda-graph-max-bs", "8"]
    env = render_env(parse_config(raw))
    assert env["NCCL_DEBUG"] == "WARN"
    assert env["HF_HOME"] == "/var/cache/x/huggingface"
    assert env["TRITON_CACHE_DIR"] == "/var/cache/x/triton"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/var/cache/x/inductor"
    assert env["FLASHINFER_WORKSPACE_BASE"] == "/var/cache/x/flashinfer"
    assert env["TVM_FFI_CACHE_DIR"] == "/var/cache/x/tvm-ffi"


def test_tp_defaults_to_gpu_count_and_empty_gpus_leave_visibility_alone():
    assert parse_config(cfg_with(gpus=[0, 1, 2, 3])).tensor_parallel_size == 4
    cfg = parse_config(cfg_with(gpus=[], tensorParallelSize=2))
    assert "CUDA_VISIBLE_DEVICES" not in render_env(cfg)
    assert flag_value(render_argv(cfg), "--tp-size") == "2"


def test_known_keys_cover_the_documented_contract():
    contract = {"name", "model", "modelRevision", "draftModel", "draftModelRevision",
                "algorithm", "ddtree", "blockSize", "host", "port", "gpus",
                "tensorParallelSize", "memFractionStatic", "attentionBackend", "contextLength",
                "maxRunningRequests", "servedModelName", "apiKeyFile", "environment",
                "extraArgs", "preflight", "startTimeout", "freezeGc"}
    assert contract <= set(KNOWN_KEYS)


def test_load_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ConfigError, match="not JSON"):
        load_config(bad)


@pytest.mark.parametrize("content", ["{nope", json.dumps(cfg_with(port=0))])
def test_cli_bad_config_is_exit_2_one_line(tmp_path, content):
    path = tmp_path / "c.json"
    path.write_text(content)
    for sub in ("serve", "unit"):
        r = subprocess.run([sys.executable, "-m", "sglang_dflash", sub, "--config", str(path)],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr


def test_examples_are_valid():
    from pathlib import Path

    examples = sorted((Path(__file__).parents[2] / "examples").glob("*.json"))
    assert examples, "no example configs"
    for path in examples:
        load_config(path)
