"""parse_config refuses values SGLang's argparse would read differently, naming the key."""

from __future__ import annotations

import pytest

from sglang_dflash.config import ConfigError, parse_config, render_argv

BASE = {"name": "q", "model": "Qwen/Qwen3-8B", "draftModel": "z-lab/d", "algorithm": "ddtree",
        "gpus": [0]}


@pytest.mark.parametrize(
    ("changes", "key", "fragment"),
    [
        # argparse reads a value starting with '-' as the next flag
        ({"model": "-weights"}, "model", "starts with '-'"),
        ({"draftModel": "--port"}, "draftModel", "starts with '-'"),
        ({"servedModelName": "-x"}, "servedModelName", "starts with '-'"),
        ({"host": "-h"}, "host", "starts with '-'"),
        ({"modelRevision": "-r"}, "modelRevision", "starts with '-'"),
        # argparse accepts unambiguous abbreviations of long flags
        ({"extraArgs": ["--api-ke=sk-1"]}, "extraArgs", "--api-key"),
        ({"extraArgs": ["--admin-api", "sk-1"]}, "extraArgs", "--admin-api-key"),
        ({"extraArgs": ["--conf", "/tmp/x.yaml"]}, "extraArgs", "--config"),
        ({"extraArgs": ["--speculative-alg=EAGLE"]}, "extraArgs", "--speculative-algorithm"),
        ({"extraArgs": ["--model-pa", "/other"]}, "extraArgs", "--model-path"),
        # a NUL cannot be exec'd; a control character would corrupt a unit line or the log
        ({"model": "a\0b"}, "model", "control characters"),
        ({"apiKeyFile": "/k\nExecStartPre=/x"}, "apiKeyFile", "control characters"),
        ({"cacheDir": "/c\r"}, "cacheDir", "control characters"),
        ({"environment": {"A": "x\0"}}, "environment.A", "NUL"),
        ({"extraArgs": ["--x", "a\0"]}, "extraArgs", "NUL"),
    ],
)
def test_ambiguous_values_fail_naming_the_key(changes, key, fragment):
    with pytest.raises(ConfigError) as exc:
        parse_config({**BASE, **changes})
    msg = str(exc.value)
    assert msg.startswith(key) and fragment in msg and "\n" not in msg, msg


def test_invalid_environment_name_error_stays_on_one_line():
    with pytest.raises(ConfigError) as exc:
        parse_config({**BASE, "environment": {"A\nB": "1"}})
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(
    "changes",
    [{"model": "./-weights"}, {"model": "/srv/models/-w"}, {"environment": {"A": "x\ny"}},
     {"extraArgs": ["--json-model-override-args", '{"a":\n1}']},
     {"extraArgs": ["--tp-size-hint"]},  # longer than an owned flag: not an abbreviation
     {"extraArgs": ["--", "x"]}],
)
def test_legitimate_lookalikes_still_pass(changes):
    cfg = parse_config({**BASE, **changes})
    assert render_argv(cfg)
