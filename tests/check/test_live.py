"""Live layer against the stand-in SGLang server (a real HTTP server process)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_dflash.check import live
from tests.check.fakes import run_check
from tests.conftest import free_port

DFLASH = ("--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "draft-m")


def wait_healthy(url: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return url
        except OSError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"{url} never became healthy")


def live_check(tmp_path: Path, url: str, *args: str):
    return run_check("--layer", "live", "--url", url, *args, cwd=tmp_path)


def test_dflash_server_passes(tmp_path: Path, standin_server) -> None:
    url = wait_healthy(standin_server(*DFLASH))
    rc, res, err, _ = live_check(tmp_path, url, "--expect-algorithm", "dflash",
                                 "--expect-draft-model", "draft-m")
    assert rc == 0, (res, err)
    assert res["live.algorithm"]["found"] == "speculative_algorithm=DFLASH (dflash)"
    assert res["live.draft_model"]["found"] == "draft model draft-m"
    assert res["live.generate"]["found"] == "8 tokens generated (greedy)"
    assert "accept length" in res["live.speculation"]["found"]


def test_ddtree_budget_is_verify_width_minus_one(tmp_path: Path, standin_server) -> None:
    # as serve starts DDTree: the plugin makes SGLang report verify width budget + 1 = 9
    url = wait_healthy(standin_server(*DFLASH, SGLANG_DFLASH_DDTREE_BUDGET="8"))
    rc, res, _, _ = live_check(tmp_path, url, "--expect-algorithm", "ddtree",
                               "--expect-ddtree-budget", "8")
    assert rc == 0 and res["live.ddtree_budget"]["status"] == "PASS"
    rc, res, _, _ = live_check(tmp_path, url, "--expect-algorithm", "ddtree",
                               "--expect-ddtree-budget", "4")
    assert rc == 1
    assert res["live.ddtree_budget"]["found"] == (
        "speculative_num_draft_tokens=9, expected budget 4 + 1 = 5")
    # the fix names what really sets the budget; SGLang has no --speculative-ddtree-budget
    fix = res["live.ddtree_budget"]["fix"]
    assert "ddtree.budget" in fix and "--speculative-ddtree-budget" not in fix


def test_wrong_algorithm_fails(tmp_path: Path, standin_server) -> None:
    plain = wait_healthy(standin_server())
    rc, res, _, _ = live_check(tmp_path, plain, "--expect-algorithm", "dflash")
    assert rc == 1
    assert res["live.algorithm"]["found"] == (
        "server reports speculative_algorithm=None, expected DFLASH (dflash)")
    assert "live.speculation" not in res  # a plain server is not asked for spec stats
    spec = wait_healthy(standin_server(*DFLASH))
    rc, res, _, _ = live_check(tmp_path, spec, "--expect-algorithm", "none")
    assert rc == 1 and res["live.algorithm"]["found"] == "server speculates with DFLASH, " \
        "expected none"


def test_wrong_draft_model_fails(tmp_path: Path, standin_server) -> None:
    url = wait_healthy(standin_server(*DFLASH))
    rc, res, _, _ = live_check(tmp_path, url, "--expect-draft-model", "other")
    assert rc == 1 and res["live.draft_model"]["status"] == "FAIL"


def test_api_key(tmp_path: Path, standin_server) -> None:
    url = wait_healthy(standin_server(*DFLASH, "--api-key", "s3cret"))
    rc, res, _, _ = live_check(tmp_path, url)
    assert rc == 1 and res["live.server_info"]["found"] == "401 unauthorized"
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    rc, res, err, _ = live_check(tmp_path, url, "--api-key-file", str(key))
    assert rc == 0, (res, err)


def test_dead_url_fails_fast(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    rc, res, _, elapsed = live_check(tmp_path, url)
    assert rc == 1
    assert res["live.health"]["found"] == f"connection refused by {url} (nothing listening)"
    assert elapsed < 2.0


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A socket that listens (connections complete in the backlog) but never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def test_silent_server_times_out(tmp_path: Path, silent_port: int) -> None:
    url = f"http://127.0.0.1:{silent_port}"
    rc, res, _, elapsed = live_check(tmp_path, url, "--timeout", "1")
    assert rc == 1
    assert res["live.health"]["found"] == f"no answer from {url} within 1 s"
    assert elapsed < 3.5


def test_slow_generation_times_out(tmp_path: Path, standin_server) -> None:
    # a fast /health (not SGLang's 1 s one), so the generation is what times out
    url = wait_healthy(standin_server(*DFLASH, STANDIN_TOKEN_DELAY="1.5",
                                      STANDIN_HEALTH_DELAY="0.05"))
    rc, res, _, elapsed = live_check(tmp_path, url, "--timeout", "1")
    assert rc == 1
    assert res["live.request"]["found"] == f"no answer from {url} within 1 s"
    assert elapsed < 4


def test_a_timeout_shorter_than_sglangs_health_says_so(tmp_path: Path, standin_server) -> None:
    """SGLang 0.5.17's /health takes a second once the server is up (the stand-in's too):
    --timeout 1 cannot see it answer, and the fix says why."""
    url = wait_healthy(standin_server(*DFLASH))
    rc, res, _, _ = live_check(tmp_path, url, "--timeout", "0.5")
    assert rc == 1
    assert res["live.health"]["found"] == f"no answer from {url} within 0.5 s"
    assert res["live.health"]["fix"].startswith("use --timeout 2 or more (SGLang 0.5.17's")


def test_not_ready_server(tmp_path: Path, standin_server) -> None:
    url = standin_server(STANDIN_NEVER_READY="1")
    _rc, res, _, _ = live_check(tmp_path, url)
    assert res["live.health"]["found"] == "GET /health answered 503 (not ready or unhealthy)"


@pytest.mark.parametrize(("argv", "message"), [
    (["--url", "ftp://127.0.0.1:1"], "is not http(s)://host:port"),
    (["--url", "http://127.0.0.1"], "is not http(s)://host:port"),
    (["--url", "http://127.0.0.1:99999"], "bad port"),
    (["--url", "http://127.0.0.1:8000/generate"], "must not have a path"),
    (["--offline", "--url", "http://127.0.0.1:8000"], "contradict"),
    (["--layer", "live"], "--layer live needs --url"),
    (["--expect-algorithm", "dflash", "--expect-ddtree-budget", "8"], "ddtree budget"),
    (["--expect-ddtree-budget", "0"], "positive integer"),
    (["--api-key-file", "/nonexistent/key"], "--api-key-file"),
    (["--timeout", "0"], "--timeout must be > 0"),
])
def test_usage_errors_exit_2_with_one_line(tmp_path: Path, argv: list[str],
                                           message: str) -> None:
    p = subprocess.run([sys.executable, "-m", "sglang_dflash", "check", *argv],
                       capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert p.returncode == 2, p
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], p.stderr


def test_expectations_from_plain_values() -> None:
    assert live.expectations_from("DDTree", "d", 8) == live.Expectations("ddtree", "d", 8)
    with pytest.raises(ValueError, match="not one of"):
        live.expectations_from("eagle")
    with pytest.raises(ValueError, match="positive integer"):
        live.expectations_from("ddtree", ddtree_budget=True)


def test_server_info_evaluation_is_case_insensitive_and_strict() -> None:
    exp = live.Expectations("ddtree", "d", 8)
    info = {"speculative_algorithm": "dflash", "speculative_draft_model_path": "d",
            "speculative_num_draft_tokens": 9}
    # the policy line: a server without the plugin's report is a SKIP when none is expected
    assert [r.status for r in live.evaluate_server_info(info, exp)] == ["PASS"] * 3 + ["SKIP"]
    none = live.evaluate_server_info({"speculative_algorithm": "NONE"}, live.Expectations("none"))
    assert none[0].status == "PASS"
    eagle = live.evaluate_server_info({"speculative_algorithm": "EAGLE"}, exp)
    assert eagle[0].status == "FAIL" and "EAGLE" in eagle[0].found


def test_generation_evaluation() -> None:
    ok = {"output_ids": list(range(8)),
          "meta_info": {"spec_verify_ct": 3, "spec_accept_length": 2.67}}
    assert [r.found for r in live.evaluate_generation(200, ok, True)] == [
        "8 tokens generated (greedy)", "spec_verify_ct=3, accept length 2.67"]
    short = {"output_ids": [1, 2], "meta_info": {}}
    res = live.evaluate_generation(200, short, True)
    assert res[0].found == "got 2 output ids, expected 8"
    assert res[1].status == "FAIL" and "not speculating" in res[1].fix
    assert live.evaluate_generation(500, "boom", False)[0].found == \
        "POST /generate answered 500: boom"


def test_an_adaptive_servers_accept_length_says_it_is_tokens_a_round() -> None:
    """§40: `check --url` on the adaptive server of the absent regime said "accept length 8.00"
    (one no-draft round of 8 steps); the line now says what the number is."""
    body = {"output_ids": list(range(8)),
            "meta_info": {"spec_verify_ct": 1, "spec_accept_length": 8.0}}
    info = {"internal_states": [{"ddtree": {"policy": "adaptive 1:0,3,7,15,31,64",
                                            "nodraft_steps": 8, "slots": {}}}]}
    assert live.adaptive_nodraft_steps(info) == 8
    found = live.evaluate_generation(200, body, True, live.adaptive_nodraft_steps(info))[1].found
    assert found.startswith("spec_verify_ct=1, accept length 8.00 (tokens a round: the "
                            "adaptive policy's no-draft rounds of 8 decode steps"), found
    fixed = {"internal_states": [{"ddtree": {"policy": "fixed", "nodraft_steps": 8}}]}
    assert live.adaptive_nodraft_steps(fixed) is None
    assert live.adaptive_nodraft_steps({}) is None
    plain = live.evaluate_generation(200, body, True, live.adaptive_nodraft_steps(fixed))
    assert plain[1].found == "spec_verify_ct=1, accept length 8.00"
