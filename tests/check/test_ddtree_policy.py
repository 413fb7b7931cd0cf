"""The DDTree budget policy end to end: `ddtree.policy` in the instance config, its
environment for the server, and `check --url` reading the policy the server reports
(internal_states[0].ddtree of /server_info; the stand-in reports what the plugin adds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_dflash.check import live
from sglang_dflash.config import (
    DDTREE_POLICY_ENV,
    ConfigError,
    parse_config,
    render_env,
    unset_env,
)
from sglang_dflash.sglang_overlay import settings
from tests.check.test_live import DFLASH, live_check, wait_healthy

AUTO16 = "adaptive 1:0,3,7,16;32:0,3,7,15"
# what live.ddtree_policy appends for a server at SGLang's speculative default (§35)
CAP48 = ("; at most 48 running requests (SGLang's default for a speculative server: more wait "
         "in its queue; maxRunningRequests lifts it)")


def cfg(**ddtree):
    return parse_config({"name": "p", "model": "m", "draftModel": "d", "algorithm": "ddtree",
                         "ddtree": {"budget": 16, **ddtree}})


def test_the_config_names_the_same_variable_as_the_worker():
    assert DDTREE_POLICY_ENV == settings.POLICY_ENV


def test_policy_reaches_the_server_environment_only_when_adaptive():
    fixed, adaptive = cfg(), cfg(policy="adaptive")
    assert fixed.ddtree.policy == "fixed" and DDTREE_POLICY_ENV not in render_env(fixed)
    assert DDTREE_POLICY_ENV in unset_env(fixed)  # an inherited policy must not leak in
    assert render_env(adaptive)[DDTREE_POLICY_ENV] == "adaptive"
    assert DDTREE_POLICY_ENV not in unset_env(adaptive)
    dflash = parse_config({"name": "p", "model": "m", "draftModel": "d", "algorithm": "dflash"})
    assert DDTREE_POLICY_ENV in unset_env(dflash)


@pytest.mark.parametrize("raw,needle", [
    ("sometimes", "ddtree.policy='sometimes'"),
    ("adaptive:1:0,99", "outside 0..16"),
    ("adaptive:2:0,16", "must start at batch size 1"),
    (7, "ddtree.policy"),
])
def test_bad_policies_are_one_line_config_errors(raw, needle):
    with pytest.raises(ConfigError) as exc:
        cfg(policy=raw)
    msg = str(exc.value)
    assert needle in msg and "\n" not in msg


def test_the_policy_variable_cannot_be_set_through_environment():
    with pytest.raises(ConfigError, match=r"set `ddtree\.policy` instead"):
        parse_config({"name": "p", "model": "m", "draftModel": "d", "algorithm": "ddtree",
                      "environment": {DDTREE_POLICY_ENV: "adaptive"}})


def test_misspelt_policy_key_gets_a_hint():
    with pytest.raises(ConfigError, match="did you mean 'policy'"):
        cfg(polciy="adaptive")


def test_expectations_canonicalise_the_policy():
    exp = live.expectations_from("ddtree", None, 16, "adaptive")
    assert exp.ddtree_policy == AUTO16
    with pytest.raises(ValueError, match="needs the ddtree budget"):
        live.expectations_from("ddtree", None, None, "adaptive")


def _info(state):
    return {"internal_states": [{"avg_spec_accept_length": 2.0,
                                 **({"ddtree": state} if state is not None else {})}]}


def test_evaluate_policy_pass_fail_skip():
    state = {"policy": AUTO16, "budget": 16, "slots": {
        "8": {"current": 0, "accept": {"0": 1.0}}, "1": {"current": 16, "accept": {"16": 3.2}}}}
    ok = live.evaluate_ddtree_policy(_info(state), AUTO16)
    assert ok.status == "PASS"
    assert ok.found == f"policy {AUTO16} (budget 16); bs 1 -> 16 (accept 3.20), bs 8 -> 0"
    bad = live.evaluate_ddtree_policy(_info(state), "fixed")
    assert bad.status == "FAIL" and "ddtree.policy" in bad.fix
    missing = live.evaluate_ddtree_policy(_info(None), "fixed")
    assert missing.status == "FAIL" and "reports no DDTree policy" in missing.found
    assert live.evaluate_ddtree_policy(_info(None), None).status == "SKIP"
    steps = live.evaluate_ddtree_policy(_info(state | {"nodraft_steps": 8}), AUTO16)
    assert steps.found.startswith(f"policy {AUTO16} (budget 16, no-draft round of 8 decode steps)")
    one = live.evaluate_ddtree_policy(_info(state | {"nodraft_steps": 1}), AUTO16)
    assert one.found == ok.found  # a single step is not worth a mention
    off = live.evaluate_ddtree_policy(_info(state | {"fast_plan": "off"}), AUTO16)
    assert off.found == ok.found
    on = live.evaluate_ddtree_policy(_info(state | {"fast_plan": "on"}), AUTO16)
    assert on.found.startswith(f"policy {AUTO16} (budget 16, sync-free plan on);")
    held = live.evaluate_ddtree_policy(_info(state | {
        "fast_plan": "check", "fast_plan_checks": {"rounds": 40, "violations": 0}}), AUTO16)
    assert held.status == "PASS"
    assert "(budget 16, sync-free plan check (40 rounds checked));" in held.found
    broke = live.evaluate_ddtree_policy(_info(state | {
        "fast_plan": "check", "fast_plan_checks": {"rounds": 40, "violations": 3}}), AUTO16)
    assert broke.status == "FAIL" and "in 3 of 40 rounds" in broke.found
    assert "SGLANG_DFLASH_DDTREE_FAST_PLAN=0" in broke.fix
    bound = live.evaluate_ddtree_policy(_info(state | {"fast_plan": "on", "host_lens": "bound"}),
                                        AUTO16)
    assert "(budget 16, sync-free plan on, host lengths from the reserved bound);" in bound.found
    assert live.evaluate_ddtree_policy(_info(state | {"fast_plan": "on", "host_lens": "sync"}),
                                       AUTO16).found == on.found
    broke_bound = live.evaluate_ddtree_policy(_info(state | {
        "fast_plan": "check", "host_lens": "bound",
        "fast_plan_checks": {"rounds": 40, "violations": 1}}), AUTO16)
    assert broke_bound.status == "FAIL"
    assert "SGLANG_DFLASH_DDTREE_HOST_LENS=sync" in broke_bound.fix


def test_the_running_request_cap_is_reported() -> None:
    """§35: SGLang caps a speculative server at 48 running requests unless told otherwise, and
    at c = 64 that alone put the adaptive server at 0.69 x no speculation: the line says so."""
    state = {"policy": AUTO16, "budget": 16, "slots": {"1": {"current": 0, "accept": {}}}}
    plain = live.evaluate_ddtree_policy(_info(state), AUTO16)
    capped = live.evaluate_ddtree_policy(_info(state) | {"max_running_requests": 48}, AUTO16)
    assert capped.status == "PASS"
    assert capped.found == plain.found + CAP48
    lifted = live.evaluate_ddtree_policy(_info(state) | {"max_running_requests": 64}, AUTO16)
    assert lifted.found == plain.found + "; at most 64 running requests"
    for odd in (None, "48", True, 4.5):
        res = live.evaluate_ddtree_policy(_info(state) | {"max_running_requests": odd}, AUTO16)
        assert res.found == plain.found, odd


def test_the_bound_with_flashinfer_is_a_fail() -> None:
    """§30: a worker that planned FlashInfer from the reserved bound served wrong tokens while
    `check --url` passed; the server's own attention flags now judge the worker's report."""
    state = {"policy": "fixed", "budget": 16, "fast_plan": "on", "host_lens": "bound"}
    for field in settings.ATTENTION_BACKEND_ARGS:
        res = live.evaluate_ddtree_policy(_info(state) | {field: "flashinfer"}, None)
        assert res.status == "FAIL", field
        assert f"({field}=flashinfer)" in res.found and "split-KV" in res.found
        assert settings.HOST_LENS_ENV in res.fix and "\n" not in res.found
    told = live.evaluate_ddtree_policy(_info(state | {"flashinfer_plans": True}), None)
    assert told.status == "FAIL" and "(the worker reports it)" in told.found
    # the bound elsewhere, and exact lengths on FlashInfer, pass
    assert live.evaluate_ddtree_policy(_info(state) | {"attention_backend": "triton"},
                                       None).status == "PASS"
    assert live.evaluate_ddtree_policy(_info(state | {"host_lens": "sync"})
                                       | {"attention_backend": "flashinfer"}, None).status == "PASS"


def test_the_bound_with_a_padded_flashinfer_verify_passes_only_with_the_drafter_elsewhere():
    """The padded verify: the worker reports it and the server's drafter runs another backend;
    a worker that does not report it, or a drafter on FlashInfer (named, or unset: then it runs
    the target's), is still the §30 FAIL."""
    state = {"policy": "fixed", "budget": 16, "fast_plan": "on", "host_lens": "bound",
             "flashinfer_plans": True, "padded_verify": True}
    fi = {"attention_backend": "flashinfer"}
    ok = live.evaluate_ddtree_policy(
        _info(state) | fi | {"speculative_draft_attention_backend": "triton"}, None)
    assert ok.status == "PASS"
    assert "the FlashInfer verify padded to it (drafter on triton)" in ok.found
    for draft in (None, "flashinfer"):
        res = live.evaluate_ddtree_policy(
            _info(state) | fi | {"speculative_draft_attention_backend": draft}, None)
        assert res.status == "FAIL" and "split-KV" in res.found
    older = live.evaluate_ddtree_policy(
        _info(state | {"padded_verify": False}) | fi
        | {"speculative_draft_attention_backend": "triton"}, None)
    assert older.status == "FAIL"


def test_check_url_fails_a_server_planning_flashinfer_from_the_bound(tmp_path: Path,
                                                                     standin_server) -> None:
    args = (*DFLASH, "--attention-backend", "flashinfer")
    url = wait_healthy(standin_server(*args, SGLANG_DFLASH_DDTREE_BUDGET="16",
                                      STANDIN_DDTREE_HOST_LENS="bound"))
    rc, res, _, _ = live_check(tmp_path, url, "--expect-algorithm", "ddtree",
                               "--expect-ddtree-budget", "16")  # as `serve` checks its servers
    assert rc == 1 and res["live.ddtree_policy"]["status"] == "FAIL"
    assert "attention_backend=flashinfer" in res["live.ddtree_policy"]["found"]
    url = wait_healthy(standin_server(*args, SGLANG_DFLASH_DDTREE_BUDGET="16",
                                      STANDIN_DDTREE_HOST_LENS="sync"))
    rc, res, err, _ = live_check(tmp_path, url, "--expect-algorithm", "ddtree",
                                 "--expect-ddtree-budget", "16")
    assert rc == 0, (res, err)


def adaptive_standin(standin_server, *argv: str) -> str:
    """A stand-in DDTree server (budget 16, policy adaptive), healthy: its URL."""
    return wait_healthy(standin_server(*DFLASH, *argv, SGLANG_DFLASH_DDTREE_BUDGET="16",
                                       SGLANG_DFLASH_DDTREE_POLICY="adaptive"))


@pytest.mark.parametrize("argv,cap", [
    ((), CAP48),  # SGLang's DFLASH hook caps an unset one at 48, and check names it
    (("--max-running-requests", "64"), "; at most 64 running requests"),  # maxRunningRequests
])
def test_check_url_reports_the_running_policy(tmp_path: Path, standin_server, argv,
                                              cap) -> None:
    url = adaptive_standin(standin_server, *argv)
    rc, res, err, _ = live_check(tmp_path, url, "--expect-algorithm", "ddtree",
                                 "--expect-ddtree-budget", "16", "--expect-ddtree-policy",
                                 "adaptive")
    assert rc == 0, (res, err)
    assert res["live.ddtree_policy"]["found"] == f"policy {AUTO16} (budget 16){cap}"
    rc, res, _, _ = live_check(tmp_path, url, "--expect-algorithm", "ddtree",
                               "--expect-ddtree-budget", "16", "--expect-ddtree-policy", "fixed")
    assert rc == 1 and res["live.ddtree_policy"]["status"] == "FAIL"


def test_check_config_expects_the_configs_policy(tmp_path: Path, standin_server) -> None:
    """`check --config` with `ddtree.policy` fixed (the default) against a server that runs
    adaptive: the mismatch is named."""
    url = adaptive_standin(standin_server)
    port = int(url.rsplit(":", 1)[1])
    path = tmp_path / "i.json"
    path.write_text(json.dumps({"name": "p", "model": "standin-model", "draftModel": "draft-m",
                                "algorithm": "ddtree", "ddtree": {"budget": 16},
                                "port": port}))
    rc, res, _, _ = live_check(tmp_path, url, "--config", str(path))
    assert rc == 1
    assert res["live.ddtree_policy"]["found"] == (
        f"server runs policy {AUTO16!r}, expected 'fixed'")
