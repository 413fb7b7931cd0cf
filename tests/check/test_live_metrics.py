"""`check --url` reads /metrics (issue 17): a line says whether it answers, with SGLang's
spec_accept_length when present; a config that enables metrics makes a missing /metrics a
FAIL, and without that expectation it is a SKIP that names how to turn metrics on."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

from sglang_dflash.check import live
from tests.check.fakes import run_check
from tests.check.test_live import DFLASH, wait_healthy
from tests.conftest import REPO

SRC = {"PYTHONPATH": str(REPO / "src")}  # this checkout, whatever is installed

TEXT = ('# TYPE sglang:num_requests_total counter\nsglang:num_requests_total{m="x"} 3\n'
        'sglang:spec_accept_length{m="x"} 2.5\n')


def test_metrics_evaluation_is_pure_and_strict_only_when_expected():
    ok = live.evaluate_metrics(200, TEXT, None)
    assert ok.status == "PASS" and "2 sglang: series" in ok.found
    assert "spec_accept_length 2.5" in ok.found
    assert live.evaluate_metrics(200, TEXT, True).status == "PASS"
    no_spec = live.evaluate_metrics(200, "sglang:num_requests_total 1\n", True)
    assert no_spec.status == "PASS" and "spec_accept_length" not in no_spec.found
    assert live.evaluate_metrics(404, {"detail": "Not Found"}, True).status == "FAIL"
    assert live.evaluate_metrics(200, "go_gc 1\n", True).status == "FAIL"
    skip = live.evaluate_metrics(404, None, None)
    assert skip.status == "SKIP" and "metrics.enable" in skip.found


def _config(tmp_path: Path, url: str, metrics: bool) -> Path:
    parts = urlsplit(url)
    path = tmp_path / "inst.json"
    path.write_text(json.dumps({
        "name": "m", "model": "standin-model", "draftModel": "draft-m", "algorithm": "dflash",
        "gpus": [], "host": parts.hostname, "port": parts.port, "metrics": {"enable": metrics}}))
    return path


def test_metrics_enabled_server_reports_its_metrics_line(tmp_path, standin_server):
    url = wait_healthy(standin_server(*DFLASH, "--enable-metrics"))
    rc, res, err, _ = run_check("--layer", "live", "--config", str(_config(tmp_path, url, True)),
                                cwd=tmp_path, env=SRC)
    assert rc == 0, (res, err)
    assert res["live.metrics"]["status"] == "PASS"
    assert "spec_accept_length 3.0" in res["live.metrics"]["found"]


def test_config_with_metrics_against_a_server_without_them_fails(tmp_path, standin_server):
    url = wait_healthy(standin_server(*DFLASH))
    rc, res, _, _ = run_check("--layer", "live", "--config", str(_config(tmp_path, url, True)),
                              cwd=tmp_path, env=SRC)
    assert rc == 1
    assert res["live.metrics"]["status"] == "FAIL"
    rc, res, _, _ = run_check("--layer", "live", "--url", url, cwd=tmp_path, env=SRC)
    assert rc == 0 and res["live.metrics"]["status"] == "SKIP"
