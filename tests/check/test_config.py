"""`check --config FILE`: an instance config fills the live layer, through real files,
real subprocesses and the stand-in SGLang server."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from sglang_dflash.check import live
from sglang_dflash.check.instance import config_url, merged_expectations
from sglang_dflash.config import parse_config
from sglang_dflash.manifest import PACKAGE_DIR, glob_files, load_manifest, sha256_file
from tests.check.fakes import assert_passes_but_for_python, make_sglang, pinned_stack, run_check
from tests.check.test_live import wait_healthy
from tests.conftest import free_port

SERVER = ("--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "draft-m")
# a DDTree server as serve starts it: the plugin makes SGLang verify budget + 1 = 9 tokens
DDTREE_8 = {"SGLANG_DFLASH_DDTREE_BUDGET": "8"}


def write_config(path: Path, **keys: object) -> Path:
    """An instance config as the NixOS module writes it (JSON, the module's key names)."""
    path.write_text(json.dumps({"name": "test", "model": "target-m", **keys}))
    return path


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def ddtree_config(path: Path, port: int, budget: int = 8, draft: str = "draft-m",
                  **keys: object) -> Path:
    return write_config(path, algorithm="ddtree", draftModel=draft, ddtree={"budget": budget},
                        host="0.0.0.0", port=port, **keys)


def test_config_gives_url_and_expectations(tmp_path: Path, standin_server) -> None:
    url = wait_healthy(standin_server(*SERVER, **DDTREE_8))
    cfg = ddtree_config(tmp_path / "i.json", port_of(url))
    rc, res, err, _ = run_check("--layer", "live", "--config", str(cfg), cwd=tmp_path)
    assert rc == 0, (res, err)
    # 0.0.0.0 is a bind address: the check goes to loopback
    assert res["live.health"]["found"] == f"GET http://127.0.0.1:{port_of(url)}/health 200"
    assert res["live.algorithm"]["found"] == "speculative_algorithm=DFLASH (ddtree)"
    assert res["live.draft_model"]["found"] == "draft model draft-m"
    assert res["live.ddtree_budget"]["found"] == (
        "verify width 9 = budget 8 + 1 (DDTree active)")


def test_server_that_differs_from_the_config_fails(tmp_path: Path, standin_server) -> None:
    url = wait_healthy(standin_server(*SERVER, **DDTREE_8))
    cfg = ddtree_config(tmp_path / "i.json", port_of(url), budget=4, draft="other-draft")
    rc, res, _, _ = run_check("--layer", "live", "--config", str(cfg), cwd=tmp_path)
    assert rc == 1
    assert res["live.ddtree_budget"]["found"] == (
        "speculative_num_draft_tokens=9, expected budget 4 + 1 = 5")
    assert res["live.draft_model"]["found"] == "draft model draft-m, expected other-draft"


def test_explicit_flags_win_over_the_config(tmp_path: Path, standin_server) -> None:
    url = wait_healthy(standin_server(*SERVER, **DDTREE_8))
    cfg = ddtree_config(tmp_path / "i.json", port_of(url), budget=4, draft="other-draft")
    rc, res, err, _ = run_check("--layer", "live", "--config", str(cfg),
                                "--expect-ddtree-budget", "8", "--expect-draft-model", "draft-m",
                                cwd=tmp_path)
    assert rc == 0, (res, err)
    # expecting plain DFlash: the config's DDTree budget no longer applies
    rc, res, err, _ = run_check("--layer", "live", "--config", str(cfg),
                                "--expect-algorithm", "dflash", "--expect-draft-model", "draft-m",
                                cwd=tmp_path)
    assert rc == 0, (res, err)
    assert "live.ddtree_budget" not in res
    assert res["live.algorithm"]["found"] == "speculative_algorithm=DFLASH (dflash)"


def test_url_flag_wins_over_host_and_port(tmp_path: Path, standin_server) -> None:
    url = wait_healthy(standin_server(*SERVER, **DDTREE_8))
    dead = free_port()
    cfg = ddtree_config(tmp_path / "i.json", dead)
    rc, res, err, _ = run_check("--layer", "live", "--config", str(cfg), "--url", url,
                                cwd=tmp_path)
    assert rc == 0, (res, err)
    rc, res, _, elapsed = run_check("--layer", "live", "--config", str(cfg), cwd=tmp_path)
    assert rc == 1
    assert res["live.health"]["found"] == (
        f"connection refused by http://127.0.0.1:{dead} (nothing listening)")
    assert elapsed < 3


def test_api_key_from_api_key_file(tmp_path: Path, standin_server) -> None:
    url = wait_healthy(standin_server(*SERVER, "--api-key", "s3cret", **DDTREE_8))
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    cfg = ddtree_config(tmp_path / "i.json", port_of(url), apiKeyFile=str(key))
    rc, res, err, _ = run_check("--layer", "live", "--config", str(cfg), cwd=tmp_path)
    assert rc == 0, (res, err)
    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n")
    rc, res, _, _ = run_check("--layer", "live", "--config", str(cfg), "--api-key-file",
                              str(wrong), cwd=tmp_path)
    assert rc == 1 and res["live.server_info"]["found"] == "401 unauthorized"


def test_api_key_from_the_systemd_credential(tmp_path: Path, standin_server) -> None:
    """Under the unit, apiKeyFile may be unreadable; LoadCredential puts it in the cred dir."""
    url = wait_healthy(standin_server(*SERVER, "--api-key", "s3cret", **DDTREE_8))
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "api-key").write_text("s3cret\n")
    cfg = ddtree_config(tmp_path / "i.json", port_of(url), apiKeyFile="/nonexistent/key")
    rc, res, err, _ = run_check("--layer", "live", "--config", str(cfg), cwd=tmp_path,
                                env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert rc == 0, (res, err)


def test_plain_instance_expects_no_speculation(tmp_path: Path, standin_server) -> None:
    url = wait_healthy(standin_server())
    cfg = write_config(tmp_path / "i.json", algorithm="none", port=port_of(url))
    rc, res, err, _ = run_check("--layer", "live", "--config", str(cfg), cwd=tmp_path)
    assert rc == 0, (res, err)
    assert res["live.algorithm"]["found"] == "no speculation (None) as expected"
    spec = wait_healthy(standin_server(*SERVER))
    cfg = write_config(tmp_path / "i.json", algorithm="none", port=port_of(spec))
    rc, res, _, _ = run_check("--layer", "live", "--config", str(cfg), cwd=tmp_path)
    assert rc == 1 and res["live.algorithm"]["status"] == "FAIL"


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening socket: any connection the check makes to it is seen by accept()."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        s.settimeout(0.2)
        yield s


def current_manifest(tmp_path: Path) -> Path:
    """The committed manifest with the overlay hashes of this checkout (others edit it)."""
    data = json.loads((PACKAGE_DIR / "manifest.json").read_text())
    data["overlay_files"] = {rel: sha256_file(PACKAGE_DIR / rel)
                             for rel in glob_files(PACKAGE_DIR, load_manifest().overlay_globs)}
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data))
    return path


def test_offline_preflight_form_passes_without_network(tmp_path: Path,
                                                       listener: socket.socket) -> None:
    """What ExecStartPre runs: `check --offline --config FILE` — no live layer, no key read."""
    site = tmp_path / "site"
    make_sglang(site)
    pinned_stack(site)
    port = listener.getsockname()[1]
    cfg = ddtree_config(tmp_path / "i.json", port, apiKeyFile="/nonexistent/key")
    rc, res, _err, _ = run_check("--offline", "--config", str(cfg), "--manifest",
                                str(current_manifest(tmp_path)), sites=(site,))
    assert_passes_but_for_python(rc, res)
    assert res["live.all"] == {"layer": "live", "name": "all", "status": "SKIP",
                               "found": "--offline: no network in this mode", "fix": ""}
    assert res["gpu.all"]["status"] == "SKIP"
    assert res["package.modules"]["status"] == "PASS"
    with pytest.raises(TimeoutError):
        listener.accept()  # nothing connected to the configured port


def test_offline_preflight_still_refuses_a_bad_config(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "i.json", algorithm="ddtree")  # no draftModel
    p = subprocess.run([sys.executable, "-m", "sglang_dflash", "check", "--offline",
                        "--config", str(cfg)], capture_output=True, text=True, cwd=tmp_path,
                       timeout=30)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == (f"sglang-dflash check: --config: {cfg}: draftModel: algorithm 'ddtree' "
                        "needs a draft model\n")


def test_default_layers_do_not_guess_the_live_url(tmp_path: Path,
                                                  listener: socket.socket) -> None:
    """Only `--layer live` turns host/port into a URL; a plain run says how to ask for it."""
    cfg = ddtree_config(tmp_path / "i.json", listener.getsockname()[1])
    _rc, res, err, _ = run_check("--config", str(cfg), "--layer", "package", cwd=tmp_path)
    assert "live.all" not in res, err
    rc, res, err, _ = run_check("--config", str(cfg), cwd=tmp_path, timeout=180)
    assert rc in (0, 1), err
    assert res["live.all"]["status"] == "SKIP"
    assert res["live.all"]["found"] == (
        f"no --url given; `--layer live` checks the configured server at "
        f"http://127.0.0.1:{listener.getsockname()[1]}")
    with pytest.raises(TimeoutError):
        listener.accept()


def bad_configs(tmp_path: Path) -> list[tuple[Path, str]]:
    notjson = tmp_path / "notjson.json"
    notjson.write_text("{name: x")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    return [
        (tmp_path / "absent.json", "cannot read config: No such file or directory"),
        (tmp_path, "cannot read config: Is a directory"),
        (notjson, "not JSON: Expecting property name enclosed in double quotes at line 1"),
        (binary, "config is not UTF-8 text"),
        (write_config(tmp_path / "unknown.json", modle="x"), "modle: unknown key"),
        (write_config(tmp_path / "inline.json", apiKey="k"), "apiKey: inline API keys"),
        (write_config(tmp_path / "budget.json", algorithm="ddtree", draftModel="d",
                      ddtree={"budget": 0}), "ddtree.budget: 0 is outside 1..1023"),
        (write_config(tmp_path / "port.json", algorithm="none", port="30000"),
         "port: must be an integer"),
        (write_config(tmp_path / "rel.json", algorithm="none", apiKeyFile="key"),
         "apiKeyFile: must be an absolute path"),
    ]


@pytest.mark.parametrize("mode", [("--offline",), ("--layer", "live")])
def test_bad_configs_exit_2_with_one_line(tmp_path: Path, mode: tuple[str, ...]) -> None:
    for path, message in bad_configs(tmp_path):
        p = subprocess.run([sys.executable, "-m", "sglang_dflash", "check", *mode,
                            "--config", str(path)], capture_output=True, text=True,
                           cwd=tmp_path, timeout=30)
        assert p.returncode == 2, (path, p)
        assert p.stdout == ""
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1, p.stderr
        assert lines[0].startswith(f"sglang-dflash check: --config: {path}: "), lines[0]
        assert message in lines[0], lines[0]


def test_unreadable_api_key_file_is_a_usage_error_only_when_live_runs(tmp_path: Path) -> None:
    cfg = ddtree_config(tmp_path / "i.json", free_port(), apiKeyFile=str(tmp_path / "none"))
    p = subprocess.run([sys.executable, "-m", "sglang_dflash", "check", "--layer", "live",
                        "--config", str(cfg)], capture_output=True, text=True, cwd=tmp_path,
                       timeout=30)
    assert p.returncode == 2
    assert p.stderr == (f"sglang-dflash check: --config: apiKeyFile: cannot read "
                        f"{tmp_path / 'none'}: No such file or directory\n")
    rc, res, err, _ = run_check("--layer", "live", "--offline", "--config", str(cfg),
                                cwd=tmp_path)
    assert rc == 0 and res["live.all"]["status"] == "SKIP", err


def test_flag_and_config_contradiction_is_a_usage_error(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "i.json", algorithm="dflash", draftModel="d")
    p = subprocess.run([sys.executable, "-m", "sglang_dflash", "check", "--offline",
                        "--config", str(cfg), "--expect-ddtree-budget", "8"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert p.returncode == 2
    assert p.stderr == ("sglang-dflash check: a ddtree budget was given but the algorithm is "
                        "dflash\n")


# --- the pure decisions -----------------------------------------------------------------

def cfg_of(**keys: object):
    return parse_config({"name": "t", "model": "m", **keys})


@pytest.mark.parametrize(("host", "url"), [
    ("0.0.0.0", "http://127.0.0.1:30000"),
    ("::", "http://[::1]:30000"),
    ("fd00::7", "http://[fd00::7]:30000"),
    ("gpu-3.example", "http://gpu-3.example:30000"),
    ("10.1.2.3", "http://10.1.2.3:30000"),
])
def test_config_url(host: str, url: str) -> None:
    assert config_url(cfg_of(algorithm="none", host=host)) == url
    assert live.parse_url(url) == url


def test_merged_expectations() -> None:
    ddtree = cfg_of(algorithm="ddtree", draftModel="d", ddtree={"budget": 16})
    dflash = cfg_of(algorithm="dflash", draftModel="d")
    plain = cfg_of(algorithm="none", draftModel="ignored")
    E = live.Expectations
    assert merged_expectations(None, None, None, None) == E()
    assert merged_expectations(ddtree, None, None, None) == E("ddtree", "d", 16,
                                                              ddtree_policy="fixed")
    assert merged_expectations(ddtree, None, "x", 3) == E("ddtree", "x", 3, ddtree_policy="fixed")
    assert merged_expectations(ddtree, "dflash", None, None) == E("dflash", "d", None)
    assert merged_expectations(ddtree, "none", None, None) == E("none", None, None)
    assert merged_expectations(dflash, None, None, None) == E("dflash", "d", None)
    assert merged_expectations(dflash, "ddtree", None, None) == E("ddtree", "d", None)
    assert merged_expectations(plain, None, None, None) == E("none", None, None)
    with pytest.raises(ValueError, match="algorithm is dflash"):
        merged_expectations(dflash, None, None, 8)

